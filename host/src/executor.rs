//! The Agent role: runs one fired Plan from start to recorded outcome.
//!
//! `start_run` (fencing, resource lock, birth delay limit) → the action → the outcome
//! decision → `finish_run` (history and state machines). The decision follows SPEC
//! section 3: 2xx is success; a code in `execution_retry_codes` is retried `retry_count`
//! times every `retry_interval`; anything else fails at once; a death action never fails
//! for good but is retried every `death_retry_interval`, so that a resource is never left
//! activated silently.
//!
//! `start` fences a batch of fired Plans and spawns the runs that may go; `finish`
//! records their outcomes in batches. This module runs one action and decides.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::actions::webhook::{CallContext, CallResult, STATUS_CONNECT_ERROR};
use crate::actions::Fence;
use crate::engine::Engine;
use crate::model::{Action, PlanKind, DEFAULT_TIMER_RETRIES};
use crate::plugins::{Invocation, InvokeContext};
use crate::store::{Claimed, FinishedRun, Owner, RunOutcome, RunRecord};

mod finish;
mod start;

pub(crate) use finish::Finished;

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

impl Engine {
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
