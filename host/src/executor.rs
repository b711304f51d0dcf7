//! The Agent role: runs one fired Plan from start to recorded outcome.
//!
//! `start_run` (fencing, resource lock, birth delay limit) → the action → the outcome
//! decision → `finish_run` (history and state machines). The decision follows SPEC
//! section 3: 2xx is success; a code in `execution_retry_codes` is retried `retry_count`
//! times every `retry_interval`; anything else fails at once; a death action never fails
//! for good but is retried every `death_retry_interval`, so that a resource is never left
//! activated silently.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::actions::webhook::{CallContext, CallResult, STATUS_CONNECT_ERROR};
use crate::model::{Action, PlanKind};
use crate::plugins::routes::MAX_PLUGIN_TIMEOUT;
use crate::plugins::{Invocation, InvokeContext};
use crate::scheduler::Engine;
use crate::store::{Claimed, FinishedRun, Owner, RunOutcome, RunRecord, StartOutcome};

/// Pause before a Plan whose resource is busy tries again.
const RESOURCE_BUSY_RETRY_MS: i64 = 50;
/// Pause before a Plan whose start could not reach Redis tries again.
const STORE_ERROR_RETRY_MS: i64 = 500;

/// What to do after a run, and the word recorded in history.
pub fn decide(
    result: &CallResult,
    attempts: u32,
    action: Option<&Action>,
    kind: PlanKind,
    retry_codes: &[u16],
    death_retry_interval_ms: i64,
    now_ms: i64,
) -> (RunOutcome, &'static str) {
    if result.is_success() {
        return (RunOutcome::Done, "success");
    }
    let retryable = result.retryable || result.status.is_some_and(|s| retry_codes.contains(&s));
    if let Some(action) = action {
        if retryable && attempts <= action.retry_count() {
            return (
                RunOutcome::Retry {
                    next_ms: now_ms.saturating_add(action.retry_interval_ms() as i64),
                },
                "retry",
            );
        }
    }
    if kind == PlanKind::Death {
        return (
            RunOutcome::Retry {
                next_ms: now_ms.saturating_add(death_retry_interval_ms),
            },
            "retry",
        );
    }
    (RunOutcome::Failed, "failed")
}

/// A plugin invocation as the decision and the history see it.
fn plugin_result(spec: &str, invocation: Invocation) -> CallResult {
    match invocation.result {
        Ok(output) => CallResult {
            output: Some(
                serde_json::from_str(&output).unwrap_or(serde_json::Value::String(output)),
            ),
            logs: invocation.logs,
            ..Default::default()
        },
        Err(failure) => CallResult {
            error: Some(failure.message(spec)),
            retryable: failure.retryable(),
            logs: invocation.logs,
            ..Default::default()
        },
    }
}

/// Retries of a failed timer run when the timer does not say.
pub const DEFAULT_TIMER_RETRIES: u32 = 3;
/// Pause between retries of a timer run whose action gives no `retry_interval`.
const DEFAULT_TIMER_RETRY_INTERVAL_MS: u64 = 1000;

/// What to do after a timer run: codes in `execution_retry_codes` are retried `retries`
/// times; then the run counts as failed and the timer goes on to its next slot.
pub fn decide_timer(
    result: &CallResult,
    attempts: u32,
    retries: u32,
    retry_interval_ms: u64,
    retry_codes: &[u16],
    now_ms: i64,
) -> (RunOutcome, &'static str) {
    if result.is_success() {
        return (RunOutcome::Done, "success");
    }
    let retryable = result.retryable || result.status.is_some_and(|s| retry_codes.contains(&s));
    if retryable && attempts <= retries {
        let interval = if retry_interval_ms == 0 {
            DEFAULT_TIMER_RETRY_INTERVAL_MS
        } else {
            retry_interval_ms
        };
        return (
            RunOutcome::Retry {
                next_ms: now_ms.saturating_add(interval as i64),
            },
            "retry",
        );
    }
    (RunOutcome::Failed, "failed")
}

/// Runs an action's call within a timer's `timeout` (None: unbounded here; the action's
/// own timeouts still apply). Past it the run ends as a 599, which retries like a
/// connect timeout.
pub(crate) async fn bounded(
    timeout_ms: Option<u64>,
    call: impl std::future::Future<Output = CallResult>,
) -> CallResult {
    let Some(limit) = timeout_ms else {
        return call.await;
    };
    tokio::time::timeout(Duration::from_millis(limit), call)
        .await
        .unwrap_or_else(|_| CallResult {
            status: Some(STATUS_CONNECT_ERROR),
            error: Some(format!(
                "the run took longer than its timeout of {limit} ms"
            )),
            ..Default::default()
        })
}

/// Most Plans one `start_run` call fences.
pub(crate) const START_BATCH: usize = 256;
/// Most runs one `finish_run` call records.
const FINISH_BATCH: usize = 256;

/// A run waiting for its outcome to be written.
pub(crate) struct Finished {
    run: FinishedRun,
}

impl Engine {
    /// Fences a batch of fired Plans in one `start_run` call and spawns the runs that may
    /// go. A run holds its worker slot while its action runs (the slots bound concurrency
    /// towards targets); recording the outcome happens after, in the finisher's batches.
    pub(crate) async fn start_batch(
        self: &Arc<Self>,
        batch: Vec<(Claimed, OwnedSemaphorePermit)>,
        finished: &mpsc::UnboundedSender<Finished>,
    ) {
        let now_ms = self.clock.now_ms();
        let actions: Vec<Result<Action, String>> = batch
            .iter()
            .map(|(plan, _)| {
                serde_json::from_str(&plan.action)
                    .map_err(|e| format!("the stored action is unreadable: {e}"))
            })
            .collect();
        let requests: Vec<(&Claimed, u64)> = batch
            .iter()
            .zip(&actions)
            .map(|((plan, _), action)| {
                let request_timeout = match action {
                    Ok(Action::Webhook(w)) => w.request_timeout_ms.map(Duration::from_millis),
                    // A plugin's own timeout is only known once it is resolved; the
                    // lock covers the longest a plugin may be given.
                    Ok(Action::Plugin(p)) => Some(
                        p.timeout_ms
                            .map(Duration::from_millis)
                            .unwrap_or(MAX_PLUGIN_TIMEOUT),
                    ),
                    Err(_) => None,
                }
                .unwrap_or(self.config.request_timeout);
                // Validation bounds action timeouts to a day; the clamp keeps the lock's
                // expiry a valid PX for Redis whatever is stored.
                let lock_ttl_ms = (self.config.lease_ttl + request_timeout)
                    .as_millis()
                    .min(2 * 86_400_000) as u64;
                (plan, lock_ttl_ms)
            })
            .collect();
        let outcomes = self
            .store
            .start_runs(
                &self.host_id,
                &requests,
                now_ms,
                self.config.birth_delay_limit_time.as_millis() as i64,
            )
            .await;
        let outcomes = match outcomes {
            Ok(o) if o.len() == batch.len() => o,
            other => {
                if let Err(e) = other {
                    tracing::warn!(error = %e, plans = batch.len(), "cannot start runs; trying again");
                }
                for (plan, _) in batch {
                    self.schedule(plan, now_ms + STORE_ERROR_RETRY_MS);
                }
                return;
            }
        };
        let mut deferred = false;
        for (((plan, slot), action), outcome) in batch.into_iter().zip(actions).zip(outcomes) {
            match outcome {
                StartOutcome::Run { attempts } => {
                    let engine = self.clone();
                    let finished = finished.clone();
                    self.running.fetch_add(1, Ordering::AcqRel);
                    self.in_flight
                        .lock()
                        .expect("in-flight lock")
                        .insert(plan.plan_id.clone());
                    tokio::spawn(async move {
                        let run = engine.run_one(plan, action, attempts).await;
                        drop(slot);
                        // The finisher outlives every run (it ends when the last sender
                        // drops), so this send only fails if the engine is gone.
                        let _ = finished.send(Finished { run });
                    });
                }
                StartOutcome::Busy => self.schedule(plan, now_ms + RESOURCE_BUSY_RETRY_MS),
                StartOutcome::Wait { retry_in_ms } => self.schedule(plan, now_ms + retry_in_ms),
                StartOutcome::Invalidated => {
                    self.metrics
                        .record_run(PlanKind::Birth, "invalidated", None);
                    self.forget()
                }
                StartOutcome::Lost => self.forget(),
                StartOutcome::Deferred => {
                    // Back in due_tasks for later: the claimer's sleep must account for it.
                    self.forget();
                    deferred = true;
                }
            }
        }
        if deferred {
            self.wake_claimer();
        }
    }

    /// Runs one action and decides what comes next.
    async fn run_one(
        &self,
        plan: Claimed,
        action: Result<Action, String>,
        attempts: u32,
    ) -> FinishedRun {
        let owner = plan.owner();
        // Timers and tasks name themselves in X-Kairos-Life / X-Kairos-Plan too, and add
        // their own headers. A timer's Idempotency-Key names the slot: each slot is a
        // different piece of work for the target.
        let (uuid, plan_word, extra_headers): (String, &'static str, Vec<(&'static str, String)>) =
            match owner {
                Some(Owner::Life(uuid, kind)) => (uuid.to_string(), kind.as_str(), Vec::new()),
                Some(Owner::Timer(name)) => (
                    name.to_string(),
                    "timer",
                    vec![
                        ("x-kairos-timer", name.to_string()),
                        (
                            "idempotency-key",
                            format!("{}@{}", plan.plan_id, plan.fire_at_ms),
                        ),
                    ],
                ),
                Some(Owner::Task { queue, task }) => (
                    format!("{queue}/{task}"),
                    "task",
                    vec![
                        ("x-kairos-queue", queue.to_string()),
                        ("x-kairos-task", task.to_string()),
                    ],
                ),
                None => (plan.plan_id.clone(), "birth", Vec::new()),
            };
        let kind = match owner {
            Some(Owner::Life(_, kind)) => kind,
            _ => PlanKind::Birth,
        };
        let started_at_ms = self.clock.now_ms();
        let result = match &action {
            Ok(Action::Webhook(webhook)) => {
                let ctx = CallContext {
                    life_uuid: &uuid,
                    plan: plan_word,
                    execution_count: attempts,
                    fire_at_ms: plan.fire_at_ms,
                    resource_id: plan.resource_id.as_deref(),
                    extra_headers: &extra_headers,
                };
                bounded(plan.opts.timeout_ms, self.webhook.call(webhook, &ctx)).await
            }
            Ok(Action::Plugin(p)) => {
                let ctx = InvokeContext {
                    life_id: uuid.clone(),
                    plan: kind,
                    scheduled_at_ms: plan.fire_at_ms,
                    attempt: attempts,
                    resource_id: plan.resource_id.clone(),
                };
                let input = p.input.to_string();
                // The booking's own limit and a timer's `timeout`: the shorter one.
                let timeout_ms = match (p.timeout_ms, plan.opts.timeout_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let invocation = self
                    .plugins
                    .invoke(&p.plugin, &ctx, &input, timeout_ms)
                    .await;
                plugin_result(&p.plugin, invocation)
            }
            Err(e) => CallResult {
                status: None,
                error: Some(e.clone()),
                ..Default::default()
            },
        };
        let finished_at_ms = self.clock.now_ms();
        let (outcome, word) = match owner {
            Some(Owner::Timer(_)) => decide_timer(
                &result,
                attempts,
                plan.opts.retries.unwrap_or(DEFAULT_TIMER_RETRIES),
                action.as_ref().map(|a| a.retry_interval_ms()).unwrap_or(0),
                &self.config.execution_retry_codes,
                finished_at_ms,
            ),
            // Any failure of a task is retried under its queue's retry block, which the
            // finisher applies (it reads the queue once per batch).
            Some(Owner::Task { .. }) if result.is_success() => (RunOutcome::Done, "success"),
            Some(Owner::Task { .. }) => (RunOutcome::Failed, "failed"),
            _ => decide(
                &result,
                attempts,
                action.as_ref().ok(),
                kind,
                &self.config.execution_retry_codes,
                self.config.death_retry_interval.as_millis() as i64,
                finished_at_ms,
            ),
        };
        match owner {
            Some(Owner::Timer(_)) => self
                .metrics
                .record_timer_run(word, started_at_ms - plan.fire_at_ms),
            // A task's outcome is final only once its queue's retry block is applied.
            Some(Owner::Task { .. }) => {}
            _ => self
                .metrics
                .record_run(kind, word, Some(started_at_ms - plan.fire_at_ms)),
        }
        if result.error.is_some() {
            tracing::info!(plan = %plan.plan_id, attempts, outcome = word, error = ?result.error, "run did not succeed");
        }
        let record = RunRecord {
            should_run_at_ms: plan.fire_at_ms,
            started_at_ms,
            duration_ms: (finished_at_ms - started_at_ms).max(0) as u64,
            outcome: word,
            status: result.status,
            error: result.error,
            output: result.output,
            logs: result.logs,
            attempt: attempts,
        };
        FinishedRun {
            plan,
            outcome,
            record,
        }
    }

    /// Records finished runs in batches: whatever arrived while the previous batch was
    /// being written goes in the next one.
    pub(crate) async fn finisher(self: Arc<Self>, mut finished: mpsc::UnboundedReceiver<Finished>) {
        while let Some(first) = finished.recv().await {
            let mut batch = vec![first];
            while batch.len() < FINISH_BATCH {
                match finished.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            self.record_batch(&batch).await;
            let mut in_flight = self.in_flight.lock().expect("in-flight lock");
            for finished in &batch {
                in_flight.remove(&finished.run.plan.plan_id);
            }
            drop(in_flight);
            for _ in &batch {
                self.running.fetch_sub(1, Ordering::AcqRel);
                self.forget();
            }
        }
    }

    /// Writes outcomes, retrying while Redis is away. Gives up after the lease time: by
    /// then another host's supervisor may have taken the Plans over, and they run again
    /// (at-least-once).
    async fn record_batch(&self, batch: &[Finished]) {
        let mut lives = Vec::new();
        let mut tasks = Vec::new();
        let mut timers = Vec::new();
        for f in batch {
            match f.run.plan.owner() {
                Some(Owner::Task { .. }) => tasks.push(f.run.clone()),
                Some(Owner::Timer(_)) => timers.push(f.run.clone()),
                _ => lives.push(f.run.clone()),
            }
        }
        if !lives.is_empty() {
            self.record_lives(lives).await;
        }
        if !tasks.is_empty() {
            self.record_tasks(tasks).await;
        }
        for run in timers {
            self.record_timer(run).await;
        }
    }

    /// Calls `write` until it succeeds, retrying while Redis is away, for at most the
    /// lease time (after which another host may have taken the Plans over).
    pub(crate) async fn retry_store<T, F, Fut>(&self, what: &str, mut write: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let give_up = tokio::time::Instant::now() + self.config.lease_ttl;
        let mut pause = Duration::from_millis(50);
        loop {
            match write().await {
                Ok(v) => return Some(v),
                Err(e) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(error = %e, what, "cannot record finished runs; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(error = %e, what, "gave up recording finished runs; the self-audit hands these Plans back and they run again");
                    return None;
                }
            }
        }
    }

    async fn record_lives(&self, runs: Vec<FinishedRun>) {
        let give_up = tokio::time::Instant::now() + self.config.lease_ttl;
        let mut pause = Duration::from_millis(50);
        loop {
            let now_ms = self.clock.now_ms();
            match self
                .store
                .finish_runs(&self.host_id, &runs, now_ms, self.notify_before_ms())
                .await
            {
                Ok(held) => {
                    for (run, held) in runs.iter().zip(held) {
                        if !held {
                            tracing::warn!(plan = %run.plan.plan_id, "the Plan was taken over while it ran; its run is recorded, its state left to the new holder");
                        }
                    }
                    return;
                }
                Err(e) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(error = %e, runs = runs.len(), "cannot record finished runs; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(error = %e, runs = runs.len(), "gave up recording finished runs; the self-audit hands these Plans back and they run again");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WebhookAction;

    fn action(retry_count: u32) -> Action {
        Action::Webhook(WebhookAction {
            path: Some("/x".into()),
            url: None,
            method: "POST".into(),
            headers: Default::default(),
            body: None,
            connect_timeout_ms: None,
            request_timeout_ms: None,
            retry_count,
            retry_interval_ms: 1000,
        })
    }

    fn status(code: u16) -> CallResult {
        CallResult {
            status: Some(code),
            error: None,
            ..Default::default()
        }
    }

    const CODES: &[u16] = &[500, 502, 503, 504, 599];

    #[test]
    fn retry_rules_of_the_spec() {
        let a = action(2);
        let d = |r: &CallResult, n: u32, k: PlanKind| decide(r, n, Some(&a), k, CODES, 60_000, 0).0;
        assert_eq!(d(&status(204), 1, PlanKind::Birth), RunOutcome::Done);
        assert_eq!(
            d(&status(503), 1, PlanKind::Birth),
            RunOutcome::Retry { next_ms: 1000 }
        );
        assert_eq!(
            d(&status(599), 2, PlanKind::Birth),
            RunOutcome::Retry { next_ms: 1000 }
        );
        assert_eq!(d(&status(503), 3, PlanKind::Birth), RunOutcome::Failed);
        assert_eq!(d(&status(404), 1, PlanKind::Birth), RunOutcome::Failed);
        // A death never fails for good.
        assert_eq!(
            d(&status(404), 1, PlanKind::Death),
            RunOutcome::Retry { next_ms: 60_000 }
        );
        assert_eq!(
            d(&status(503), 3, PlanKind::Death),
            RunOutcome::Retry { next_ms: 60_000 }
        );
        let refused = CallResult {
            status: None,
            error: Some("policy".into()),
            ..Default::default()
        };
        assert_eq!(d(&refused, 1, PlanKind::Birth), RunOutcome::Failed);
    }
}
