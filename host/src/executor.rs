//! The Agent role: runs one fired Plan from start to recorded outcome.
//!
//! `start_run` (fencing, resource lock, birth delay limit) → the action → the outcome
//! decision → `finish_run` (history and state machines). The decision follows SPEC
//! section 3: 2xx is success; a code in `execution_retry_codes` is retried `retry_count`
//! times every `retry_interval`; anything else fails at once; a death action never fails
//! for good but is retried every `death_retry_interval`, so that a resource is never left
//! activated silently.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::actions::webhook::{CallContext, CallResult, STATUS_CONNECT_ERROR};
use crate::actions::Fence;
use crate::engine::{Engine, LeaseToken};
use crate::model::{Action, PlanKind, DEFAULT_TIMER_RETRIES};
use crate::plugins::{Invocation, InvokeContext};
use crate::store::{
    Callback, Claimed, FinishedRun, Owner, RunOutcome, RunRecord, StartOutcome, StartSection,
};

/// Pause before a Plan whose resource is busy tries again.
const RESOURCE_BUSY_RETRY_MS: i64 = 50;
/// Pause before a Plan whose start could not reach Redis tries again.
const STORE_ERROR_RETRY_MS: i64 = 500;
/// Pause before a Plan refused because this host's lease ran out tries again (the
/// heartbeat renews the lease meanwhile).
const LEASE_EXPIRED_RETRY_MS: i64 = 200;

/// The longest wait a target's `Retry-After` may set for a Life's or a timer's next
/// attempt (a queue task's is its queue's `max_backoff`): a target cannot park a Plan
/// for days.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;

/// The wait before the next attempt of a retryable run: the target's `Retry-After` when
/// it gave one (at most `cap_ms`), else `interval_ms`.
pub fn retry_wait_ms(result: &CallResult, interval_ms: u64, cap_ms: u64) -> i64 {
    result
        .retry_after_ms
        .map(|ms| ms.min(cap_ms))
        .unwrap_or(interval_ms)
        .min(i64::MAX as u64) as i64
}

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
            let wait = retry_wait_ms(result, action.retry_interval_ms(), MAX_RETRY_AFTER_MS);
            return (
                RunOutcome::Retry {
                    next_ms: now_ms.saturating_add(wait),
                },
                "retry",
            );
        }
    }
    if kind == PlanKind::Death {
        let wait = match retryable {
            true => retry_wait_ms(result, death_retry_interval_ms as u64, MAX_RETRY_AFTER_MS),
            false => death_retry_interval_ms,
        };
        return (
            RunOutcome::Retry {
                next_ms: now_ms.saturating_add(wait),
            },
            "retry",
        );
    }
    (RunOutcome::Failed, "failed")
}

/// A plugin invocation as the decision and the history see it. A run stopped at its
/// deadline counts as status 599, as a webhook that timed out does: one rule for both,
/// retried when 599 is in `execution_retry_codes` (it is by default).
fn plugin_result(spec: &str, invocation: Invocation) -> CallResult {
    match invocation.result {
        Ok(output) => CallResult {
            output: Some(
                serde_json::from_str(&output).unwrap_or(serde_json::Value::String(output)),
            ),
            logs: invocation.logs,
            fenced: invocation.fenced,
            ..Default::default()
        },
        Err(failure) => CallResult {
            status: matches!(failure, crate::plugins::Failure::Timeout(_))
                .then_some(STATUS_CONNECT_ERROR),
            error: Some(failure.message(spec)),
            retryable: failure.retryable(),
            logs: invocation.logs,
            fenced: invocation.fenced,
            ..Default::default()
        },
    }
}

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
    if result.cancelled {
        return (RunOutcome::Failed, "cancelled");
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
                next_ms: now_ms.saturating_add(retry_wait_ms(result, interval, MAX_RETRY_AFTER_MS)),
            },
            "retry",
        );
    }
    (RunOutcome::Failed, "failed")
}

/// A timer run under `overlap: cancel_running` cut off when the slot at `slot_ms` came:
/// dropping the call's future closes a webhook's connection and ends a plugin's
/// instance. Not retried; the finisher runs the slot that came.
fn cancelled_run(slot_ms: i64) -> CallResult {
    CallResult {
        error: Some(format!(
            "cancelled: the timer's next slot ({}) came while this run was going (overlap cancel_running)",
            crate::store::rfc3339(slot_ms, chrono_tz::UTC)
        )),
        cancelled: true,
        ..Default::default()
    }
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

/// Most runs one `finish_run` call records.
const FINISH_BATCH: usize = 256;
/// Least time recording an outcome is retried while Redis is away (a restart of Redis
/// takes seconds).
const RECORD_PATIENCE: Duration = Duration::from_secs(30);

/// One shard's Plans of a start batch, with what their runs need once started.
struct StartGroup {
    shard: u32,
    gen: u64,
    batch: Vec<(Claimed, OwnedSemaphorePermit)>,
    actions: Vec<Result<Action, String>>,
    lease: LeaseToken,
}

impl StartGroup {
    /// The group's section of a start_run call.
    fn section(&self) -> StartSection<'_> {
        StartSection {
            shard: self.shard,
            gen: self.gen,
            plans: self.batch.iter().map(|(plan, _)| plan).collect(),
        }
    }
}

/// Test hook, in debug builds only: `KAIROS_TEST_HOLD_START_MS` holds every start_run
/// answer that long before the host acts on it, as a slow network would, so that an
/// end-to-end test can drain a shard while starts it sent are applied in Redis but not
/// yet answered here (tests/tests/faults.rs). Release builds have no such hook.
async fn hold_start_answer() {
    #[cfg(debug_assertions)]
    {
        static HOLD: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
        let hold = HOLD.get_or_init(|| {
            std::env::var("KAIROS_TEST_HOLD_START_MS")
                .ok()
                .and_then(|v| v.parse().ok())
        });
        if let Some(ms) = hold {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
    }
}

/// A run waiting for its outcome to be written.
pub(crate) struct Finished {
    run: FinishedRun,
}

impl Engine {
    /// Fences a batch of fired Plans in `start_run` calls and spawns the runs that may
    /// go. A run holds its worker slot while its action runs (the slots bound concurrency
    /// towards targets); recording the outcome happens after, in the finisher's batches.
    pub(crate) async fn start_batch(
        self: &Arc<Self>,
        batch: Vec<(Claimed, OwnedSemaphorePermit)>,
        finished: &mpsc::UnboundedSender<Finished>,
    ) {
        let mut groups: BTreeMap<u32, Vec<(Claimed, OwnedSemaphorePermit)>> = BTreeMap::new();
        for (plan, slot) in batch {
            groups.entry(plan.shard).or_default().push((plan, slot));
        }
        let ready: Vec<StartGroup> = groups
            .into_iter()
            .filter_map(|(shard, group)| self.prepare_start(shard, group))
            .collect();
        if ready.is_empty() {
            return;
        }
        let now_ms = self.clock.now_ms();
        // One start_run call per shard on a Redis Cluster (a call goes to one node), all
        // at once; one call for every shard's Plans on a standalone Redis, which holds
        // them all (a shard's own calls carried a few Plans each: BENCHMARKS.md,
        // session 24).
        let calls: Vec<Vec<StartGroup>> = if self.store.is_cluster() {
            ready.into_iter().map(|group| vec![group]).collect()
        } else {
            vec![ready]
        };
        let starts = calls
            .into_iter()
            .map(|groups| self.start_call(groups, now_ms, finished));
        futures_util::future::join_all(starts).await;
    }

    /// One call of `start_run` for `groups`, a section each, and what their answers lead
    /// to. A call that fails puts every Plan of it off: start_run answers a retry for a
    /// Plan it already started as it did the first time, so trying again is safe.
    async fn start_call(
        self: &Arc<Self>,
        groups: Vec<StartGroup>,
        now_ms: i64,
        finished: &mpsc::UnboundedSender<Finished>,
    ) {
        let sections: Vec<StartSection<'_>> = groups.iter().map(StartGroup::section).collect();
        let answers = self
            .store
            .start_sections(
                &self.host_id,
                &sections,
                self.config.birth_delay_limit_time.as_millis() as i64,
            )
            .await;
        drop(sections);
        hold_start_answer().await;
        match answers {
            Ok(answers) => {
                for (group, answer) in groups.into_iter().zip(answers) {
                    self.after_start(group, Some(answer), now_ms, finished);
                }
            }
            Err(e) => {
                let plans: usize = groups.iter().map(|g| g.batch.len()).sum();
                tracing::warn!(error = %e, plans, "cannot start runs; trying again");
                for group in groups {
                    self.after_start(group, None, now_ms, finished);
                }
            }
        }
    }

    /// One shard's part of a start batch, ready for its call, or None when nothing of it
    /// starts here.
    fn prepare_start(
        self: &Arc<Self>,
        shard: u32,
        batch: Vec<(Claimed, OwnedSemaphorePermit)>,
    ) -> Option<StartGroup> {
        let Some(gen) = self.shards.active_gen(shard) else {
            // The shard is being given up or is another host's now: nothing of it starts
            // here (its Plans go back with the shard).
            for (plan, _) in batch {
                self.forget(&plan);
            }
            return None;
        };
        // A Plan that a drain of its shard let go of since it fired does not start here
        // (it goes back with the shard); the others count as busy from now on, so that
        // the drain waits for this start's answer before it hands the shard back.
        let batch: Vec<(Claimed, OwnedSemaphorePermit)> = batch
            .into_iter()
            .filter(|(plan, _)| self.mark_starting(plan))
            .collect();
        if batch.is_empty() {
            return None;
        }
        // The lease the runs start under: a run is not called once it has lapsed.
        let Some(lease) = self.lease_token(shard) else {
            // Not this host's shard any more: its Plans go with it.
            for (plan, _) in batch {
                self.forget(&plan);
            }
            return None;
        };
        let actions: Vec<Result<Action, String>> = batch
            .iter()
            .map(|(plan, _)| {
                serde_json::from_str(&plan.action)
                    .map_err(|e| format!("the stored action is unreadable: {e}"))
            })
            .collect();
        Some(StartGroup {
            shard,
            gen,
            batch,
            actions,
            lease,
        })
    }

    /// Acts on start_run's answers for one shard's Plans: runs those that start, puts
    /// off or drops the others. No answers (the call failed) put every Plan off.
    fn after_start(
        self: &Arc<Self>,
        group: StartGroup,
        outcomes: Option<Vec<StartOutcome>>,
        now_ms: i64,
        finished: &mpsc::UnboundedSender<Finished>,
    ) {
        let StartGroup {
            shard,
            batch,
            actions,
            lease,
            ..
        } = group;
        let Some(outcomes) = outcomes.filter(|o| o.len() == batch.len()) else {
            for (plan, _) in batch {
                self.put_off(plan, now_ms + STORE_ERROR_RETRY_MS);
            }
            return;
        };
        let mut deferred = false;
        for (((plan, slot), action), outcome) in batch.into_iter().zip(actions).zip(outcomes) {
            match outcome {
                StartOutcome::Run { attempts } => {
                    let engine = self.clone();
                    let finished = finished.clone();
                    let lease = lease.clone();
                    self.running.fetch_add(1, Ordering::AcqRel);
                    tokio::spawn(async move {
                        let fence = {
                            let engine = engine.clone();
                            Fence::new(move || engine.lease_intact(&lease))
                        };
                        let run = engine.run_one(plan, action, attempts, fence).await;
                        drop(slot);
                        let Some(run) = run else {
                            // Fenced: nothing to record, the Plan is another host's.
                            engine.running.fetch_sub(1, Ordering::AcqRel);
                            return;
                        };
                        // The finisher outlives every run (it ends when the last sender
                        // drops), so this send only fails if the engine is gone.
                        let _ = finished.send(Finished { run });
                    });
                }
                StartOutcome::Busy => self.put_off(plan, now_ms + RESOURCE_BUSY_RETRY_MS),
                StartOutcome::Expired => {
                    // Renew the lease (the shard keeper does it now), then try again: if
                    // the shard was taken over meanwhile, the fence says so.
                    self.lease_lost();
                    self.put_off(plan, now_ms + LEASE_EXPIRED_RETRY_MS);
                }
                StartOutcome::Late(late_ms) => {
                    // Recorded by the finisher like any outcome, under the Plan's claim.
                    self.metrics
                        .record_run(PlanKind::Birth, "invalidated", None);
                    drop(slot);
                    let run = self.invalidated_birth(plan, late_ms, now_ms);
                    self.running.fetch_add(1, Ordering::AcqRel);
                    let _ = finished.send(Finished { run });
                }
                StartOutcome::Dropped => {
                    if let Some(Owner::Task { queue, .. }) = plan.owner() {
                        self.metrics.record_task_run(queue, "expired");
                    }
                    self.forget(&plan)
                }
                StartOutcome::Lost => self.forget(&plan),
                StartOutcome::Deferred => {
                    // Waiting in Redis (its queue's waiting set, or due_tasks for the
                    // token reserved for it, often a few ms away): claim from the shard
                    // again now, so that it is back in the timer for its token's time.
                    self.forget(&plan);
                    deferred = true;
                }
            }
        }
        if deferred {
            self.mark_dirty(shard);
        }
    }

    /// Runs one action and decides what comes next.
    async fn run_one(
        &self,
        plan: Claimed,
        action: Result<Action, String>,
        attempts: u32,
        fence: Fence,
    ) -> Option<FinishedRun> {
        if !fence.holds() {
            // Frozen or cut off from Redis past its lease between the start and now:
            // another host may run this Plan already.
            return self.fenced(
                &plan,
                "between the start of a run and its call; not calling",
            );
        }
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
        if let (Some(Owner::Timer(_)), Some(limit)) = (owner, plan.opts.skip_if_late_ms) {
            let late_ms = started_at_ms - plan.fire_at_ms;
            if attempts == 1 && late_ms > limit as i64 {
                return Some(self.skip_late_timer_run(
                    plan,
                    attempts,
                    started_at_ms,
                    late_ms,
                    limit,
                ));
            }
        }
        let call = async {
            match &action {
                Ok(Action::Webhook(webhook)) => {
                    let ctx = CallContext {
                        life_uuid: &uuid,
                        plan: plan_word,
                        execution_count: attempts,
                        fire_at_ms: plan.fire_at_ms,
                        resource_id: plan.resource_id.as_deref(),
                        extra_headers: &extra_headers,
                        fence: &fence,
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
                        fence: fence.clone(),
                    };
                    let input = p.input.to_string();
                    // The booking's own limit and a timer's `timeout`: the shorter one.
                    let timeout_ms = match (p.timeout_ms, plan.opts.timeout_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let began = std::time::Instant::now();
                    let invocation = self
                        .plugins
                        .invoke_pooled(p.plugin.clone(), ctx, input, timeout_ms)
                        .await;
                    self.metrics
                        .record_plugin_invocation(&p.plugin, began.elapsed());
                    plugin_result(&p.plugin, invocation)
                }
                Err(e) => CallResult {
                    status: None,
                    error: Some(e.clone()),
                    ..Default::default()
                },
            }
        };
        let cancel_at_ms = match owner {
            Some(Owner::Timer(name)) if plan.opts.cancel_at_next_slot => {
                self.next_timer_slot(name, started_at_ms).await
            }
            _ => None,
        };
        let result = match cancel_at_ms {
            None => call.await,
            Some(at) => {
                let wait = Duration::from_millis((at - started_at_ms).max(0) as u64);
                tokio::select! {
                    result = call => result,
                    _ = tokio::time::sleep(wait) => cancelled_run(at),
                }
            }
        };
        if result.fenced {
            return self.fenced(&plan, "during a run; a request was not sent");
        }
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
        let action_kind = match &action {
            Ok(Action::Webhook(_)) => "webhook",
            Ok(Action::Plugin(_)) => "plugin",
            Err(_) => "",
        };
        self.metrics
            .record_duration(action_kind, finished_at_ms - started_at_ms);
        if word == "retry" {
            self.metrics.record_retry(crate::metrics::retry_reason(
                result.status,
                result.retryable,
            ));
        }
        match owner {
            Some(Owner::Timer(name)) => {
                self.metrics
                    .record_timer_run(name, word, started_at_ms - plan.fire_at_ms)
            }
            // A task's outcome is final only once its queue's retry block is applied.
            Some(Owner::Task { .. }) => {}
            _ => self
                .metrics
                .record_run(kind, word, Some(started_at_ms - plan.fire_at_ms)),
        }
        if let Some(error) = &result.error {
            // A failure for good (no retry left, or not retryable) is an operator's
            // business; one that will be retried, or a queue task whose retry block the
            // finisher applies, is routine.
            let final_failure = word == "failed" && !matches!(owner, Some(Owner::Task { .. }));
            if final_failure {
                self.count_failure();
                tracing::warn!(plan = %plan.plan_id, attempts, status = result.status, %error, "run failed for good");
            } else {
                tracing::info!(plan = %plan.plan_id, attempts, outcome = word, status = result.status, %error, "run did not succeed");
            }
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
            // What the next attempt's time came from; a task's is applied by the
            // finisher, under its queue's retry block.
            retry_after_ms: result
                .retry_after_ms
                .filter(|_| word == "retry" || matches!(owner, Some(Owner::Task { .. }))),
        };
        Some(FinishedRun {
            plan,
            outcome,
            record,
            callback: None,
        })
    }

    /// A run given up because this host's lease lapsed (`when`): not recorded; the Plan
    /// is left to whoever holds its shard now (this host's audit hands it back if
    /// nobody took it over).
    fn fenced(&self, plan: &Claimed, when: &str) -> Option<FinishedRun> {
        tracing::warn!(plan = %plan.plan_id, "this host's lease lapsed {when}; the run is not recorded");
        self.metrics.fenced_runs.fetch_add(1, Ordering::Relaxed);
        self.forget(plan);
        None
    }

    /// A Life's birth that came `late_ms` after its time, more than
    /// `birth_delay_limit_time`: not run; recorded Invalidated (a term birth whose
    /// earlier attempt a crash cut off leaves its Life Alive, and its death follows:
    /// `lifecycle::after_run`).
    fn invalidated_birth(&self, plan: Claimed, late_ms: i64, now_ms: i64) -> FinishedRun {
        let cut_off = plan
            .record
            .as_ref()
            .is_some_and(|r| r.is_term() && r.birth.interrupted);
        let error = if cut_off {
            format!("birth missed by {late_ms} ms, more than birth_delay_limit_time, after an attempt cut off by a host crash that may have reached the target; not run again, its death follows")
        } else {
            format!("birth missed by {late_ms} ms, more than birth_delay_limit_time")
        };
        tracing::info!(plan = %plan.plan_id, late_ms, "birth too late to run; invalidated");
        let record = RunRecord {
            should_run_at_ms: plan.fire_at_ms,
            started_at_ms: now_ms,
            duration_ms: 0,
            outcome: "invalidated",
            status: None,
            error: Some(error),
            output: None,
            logs: Vec::new(),
            attempt: plan.attempts + 1,
            retry_after_ms: None,
        };
        FinishedRun {
            plan,
            outcome: RunOutcome::Invalidated,
            record,
            callback: None,
        }
    }

    /// A timer slot whose run could not start within its `starting_deadline` (or, for
    /// `fire_all`, its catch-up window): not run, logged as skipped; the finisher goes
    /// on to the next slot.
    fn skip_late_timer_run(
        &self,
        plan: Claimed,
        attempts: u32,
        started_at_ms: i64,
        late_ms: i64,
        limit_ms: u64,
    ) -> FinishedRun {
        tracing::info!(plan = %plan.plan_id, late_ms, limit_ms, "timer slot too late to start; skipped");
        if let Some(Owner::Timer(name)) = plan.owner() {
            self.metrics.record_timer_run(name, "skipped", late_ms);
        }
        let record = RunRecord {
            should_run_at_ms: plan.fire_at_ms,
            started_at_ms,
            duration_ms: 0,
            outcome: "skipped",
            status: None,
            error: Some(format!(
                "not run: it could start only {late_ms} ms after its slot, more than its starting deadline ({limit_ms} ms)"
            )),
            output: None,
            logs: Vec::new(),
            attempt: attempts,
            retry_after_ms: None,
        };
        FinishedRun {
            plan,
            outcome: RunOutcome::Done,
            record,
            callback: None,
        }
    }

    /// Gives a run that finished its Plan for good the callback its action has for the
    /// outcome (`on_success` or `on_failure`), if any, to be booked with the outcome:
    /// a fresh Life id in the Plan's shard (drawn once, so that a finish written again
    /// books nothing twice) and the callback action carrying the outcome.
    pub(crate) fn attach_callback(&self, run: &mut FinishedRun) {
        let success = match run.outcome {
            RunOutcome::Done => true,
            RunOutcome::Failed => false,
            RunOutcome::Retry { .. } | RunOutcome::Invalidated => return,
        };
        // Most actions have no callback: spare them the parse.
        if run.record.outcome == "skipped" || !run.plan.action.contains("\"on_") {
            return;
        }
        let Ok(action) = serde_json::from_str::<Action>(&run.plan.action) else {
            return;
        };
        let callbacks = action.callbacks();
        let Some(callback) = (if success {
            &callbacks.on_success
        } else {
            &callbacks.on_failure
        }) else {
            return;
        };
        let outcome = callback_outcome(run, success);
        run.callback = Some(Callback {
            life_uuid: crate::bookings::request::new_life_uuid_in(
                self.store.placement(),
                run.plan.shard,
            ),
            action_json: serde_json::to_string(&callback.with_outcome(outcome))
                .expect("actions serialize"),
        });
    }

    /// Records finished runs in lanes (`lane_of`: one per shard on a Redis
    /// Cluster, one for all on a standalone Redis): each lane writes one batch at a time,
    /// and what finishes meanwhile goes into its next. On a cluster a shard whose master
    /// does not answer (its lane retrying for up to `RECORD_PATIENCE`) holds up no other
    /// shard's outcomes. Ends once every run sent to it is recorded.
    pub(crate) async fn finisher(self: Arc<Self>, mut finished: mpsc::UnboundedReceiver<Finished>) {
        let mut lanes: HashMap<u32, mpsc::UnboundedSender<Finished>> = HashMap::new();
        let mut lane_tasks = tokio::task::JoinSet::new();
        while let Some(run) = finished.recv().await {
            let lane = lanes
                .entry(self.lane_of(run.run.plan.shard))
                .or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    lane_tasks.spawn(self.clone().finish_lane(rx));
                    tx
                });
            let _ = lane.send(run);
        }
        drop(lanes);
        while lane_tasks.join_next().await.is_some() {}
    }

    /// One lane of the finisher.
    async fn finish_lane(self: Arc<Self>, mut finished: mpsc::UnboundedReceiver<Finished>) {
        while let Some(first) = finished.recv().await {
            let mut batch = vec![first];
            while batch.len() < FINISH_BATCH {
                match finished.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            self.record_batch(&batch).await;
            for finished in &batch {
                self.running.fetch_sub(1, Ordering::AcqRel);
                self.forget(&finished.run.plan);
            }
        }
    }

    /// Writes outcomes, retrying while Redis is away. Gives up after the lease time: by
    /// then another host's supervisor may have taken the Plans over, and they run again
    /// (at-least-once).
    async fn record_batch(&self, batch: &[Finished]) {
        // One finish call per shard and kind (a script touches one shard); on a
        // standalone Redis one call for every shard's Lives (`finish_life` takes them in
        // sections).
        let mut lives: BTreeMap<u32, Vec<FinishedRun>> = BTreeMap::new();
        let mut tasks: BTreeMap<u32, Vec<FinishedRun>> = BTreeMap::new();
        let mut timers = Vec::new();
        for f in batch {
            match f.run.plan.owner() {
                Some(Owner::Task { .. }) => tasks
                    .entry(f.run.plan.shard)
                    .or_default()
                    .push(f.run.clone()),
                Some(Owner::Timer(_)) => timers.push(f.run.clone()),
                _ => lives
                    .entry(self.lane_of(f.run.plan.shard))
                    .or_default()
                    .push(f.run.clone()),
            }
        }
        let lives = lives.into_values().map(|runs| self.record_lives(runs));
        let tasks = tasks
            .into_iter()
            .map(|(shard, runs)| self.record_tasks(shard, runs));
        let timers = timers.into_iter().map(|run| self.record_timer(run));
        futures_util::future::join3(
            futures_util::future::join_all(lives),
            futures_util::future::join_all(tasks),
            futures_util::future::join_all(timers),
        )
        .await;
    }

    /// How long recording an outcome is retried while Redis is away. The finish scripts
    /// are idempotent per (host, claim) and fenced, so a late write is never wrong: at
    /// worst it finds the Plan taken over and records only the run.
    pub(crate) fn record_patience(&self) -> Duration {
        self.config.lease_ttl.max(RECORD_PATIENCE)
    }

    /// Calls `write` until it succeeds, retrying while Redis is away, for at most
    /// `record_patience`.
    pub(crate) async fn retry_store<T, F, Fut>(&self, what: &str, mut write: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let give_up = tokio::time::Instant::now() + self.record_patience();
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

    /// Which lane a shard's Plans go in, for their start calls (`start_run`) and their
    /// finish calls (`finish_life`): their own shard's on a Redis Cluster (a shard whose
    /// master does not answer holds up no other), one for all on a standalone Redis,
    /// which holds every shard (each shard's own calls carried a few Plans each, and a
    /// call costs Redis more than its Plans' share of the work).
    pub(crate) fn lane_of(&self, shard: u32) -> u32 {
        if self.store.is_cluster() {
            shard
        } else {
            0
        }
    }

    async fn record_lives(&self, mut runs: Vec<FinishedRun>) {
        for run in &mut runs {
            self.attach_callback(run);
        }
        let give_up = tokio::time::Instant::now() + self.record_patience();
        let mut pause = Duration::from_millis(50);
        loop {
            let now_ms = self.clock.now_ms();
            match self
                .store
                .finish_lives(&self.host_id, &runs, now_ms, self.notify_before_ms())
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

/// What a callback receives (as its body or input): whose Plan finished, how, after how
/// many attempts, with the last run's status, error, duration and output.
fn callback_outcome(run: &FinishedRun, success: bool) -> serde_json::Value {
    let r = &run.record;
    let mut v = serde_json::json!({
        "callback_of": run.plan.plan_id,
        "outcome": if success { "success" } else { "failure" },
        "attempts": r.attempt,
        "status": r.status,
        "error": r.error,
        "duration_ms": r.duration_ms,
        "should_run_at_ms": r.should_run_at_ms,
        "finished_at_ms": r.started_at_ms + r.duration_ms as i64,
    });
    match run.plan.owner() {
        Some(Owner::Life(uuid, kind)) => {
            v["life_uuid"] = uuid.into();
            v["plan"] = kind.as_str().into();
        }
        Some(Owner::Timer(name)) => {
            v["timer"] = name.into();
            v["plan"] = "timer".into();
        }
        Some(Owner::Task { queue, task }) => {
            v["queue"] = queue.into();
            v["task"] = task.into();
            v["plan"] = "task".into();
        }
        None => {}
    }
    if let Some(output) = &r.output {
        v["output"] = output.clone();
    }
    v
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
            callbacks: Default::default(),
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
    fn retry_after_sets_the_next_attempt_within_the_cap() {
        let a = action(2);
        let asked = |code: u16, ms: u64| CallResult {
            retry_after_ms: Some(ms),
            ..status(code)
        };
        let d = |r: &CallResult, k: PlanKind| decide(r, 1, Some(&a), k, CODES, 60_000, 0).0;
        assert_eq!(
            d(&asked(503, 5_000), PlanKind::Birth),
            RunOutcome::Retry { next_ms: 5_000 }
        );
        assert_eq!(
            d(&asked(503, 0), PlanKind::Birth),
            RunOutcome::Retry { next_ms: 0 }
        );
        assert_eq!(
            d(&asked(503, u64::MAX), PlanKind::Birth),
            RunOutcome::Retry {
                next_ms: MAX_RETRY_AFTER_MS as i64
            }
        );
        // Not a retry code: the birth fails; a death keeps its own interval.
        assert_eq!(d(&asked(404, 5_000), PlanKind::Birth), RunOutcome::Failed);
        assert_eq!(
            d(&asked(404, 5_000), PlanKind::Death),
            RunOutcome::Retry { next_ms: 60_000 }
        );
        assert_eq!(
            d(&asked(503, 5_000), PlanKind::Death),
            RunOutcome::Retry { next_ms: 5_000 }
        );
        assert_eq!(
            decide_timer(&asked(503, 7_000), 1, 3, 0, CODES, 0).0,
            RunOutcome::Retry { next_ms: 7_000 }
        );
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        use crate::actions::webhook::parse_retry_after;
        use std::time::{Duration, UNIX_EPOCH};
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("120", now), Some(120_000));
        assert_eq!(parse_retry_after(" 3 ", now), Some(3_000));
        assert_eq!(
            parse_retry_after("99999999999999999999", now),
            Some(u64::MAX)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(30_000)
        );
        // The obsolete forms RFC 9110 still asks recipients to read.
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:50:07 GMT", now),
            Some(30_000)
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:50:07 1994", now),
            Some(30_000)
        );
        // A date already past: no wait.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(0)
        );
        for bad in ["", "-1", "1.5", "soon"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }

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
