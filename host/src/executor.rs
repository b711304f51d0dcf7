//! The Agent role: runs one fired Plan from start to recorded outcome.
//!
//! `start_run` (fencing, resource lock, birth delay limit) → the action → the outcome
//! decision → `finish_run` (history and state machines). The decision follows SPEC
//! section 3: 2xx is success; a code in `execution_retry_codes` is retried `retry_count`
//! times every `retry_interval`; anything else fails at once; a death action never fails
//! for good but is retried every `death_retry_interval`, so that a resource is never left
//! activated silently.

use std::sync::Arc;
use std::time::Duration;

use crate::actions::webhook::{CallContext, CallResult};
use crate::model::{Action, PlanKind};
use crate::scheduler::Engine;
use crate::store::{Claimed, RunOutcome, RunRecord, StartOutcome};

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
    let retryable = result.status.is_some_and(|s| retry_codes.contains(&s));
    if let Some(action) = action {
        if retryable && attempts <= action.retry_count() {
            return (
                RunOutcome::Retry {
                    next_ms: now_ms + action.retry_interval_ms() as i64,
                },
                "retry",
            );
        }
    }
    if kind == PlanKind::Death {
        return (
            RunOutcome::Retry {
                next_ms: now_ms + death_retry_interval_ms,
            },
            "retry",
        );
    }
    (RunOutcome::Failed, "failed")
}

impl Engine {
    /// Runs one Plan handed over by the dispatcher.
    pub(crate) async fn run_plan(self: &Arc<Self>, plan: Claimed) {
        let Some((uuid, kind)) = plan.life_and_kind().map(|(u, k)| (u.to_string(), k)) else {
            tracing::error!(plan = %plan.plan_id, "claimed a Plan id of an unknown shape; dropping it");
            self.forget();
            return;
        };
        let action: Result<Action, String> = serde_json::from_str(&plan.action)
            .map_err(|e| format!("the stored action is unreadable: {e}"));
        let request_timeout = match &action {
            Ok(Action::Webhook(w)) => w.request_timeout_ms.map(Duration::from_millis),
            _ => None,
        }
        .unwrap_or(self.config.request_timeout);
        let lock_ttl_ms = (self.config.lease_ttl + request_timeout).as_millis() as u64;
        let now_ms = self.clock.now_ms();
        let started = self
            .store
            .start_run(
                &self.host_id,
                &plan,
                &uuid,
                kind,
                now_ms,
                lock_ttl_ms,
                self.config.birth_delay_limit_time.as_millis() as i64,
            )
            .await;
        let attempts = match started {
            Ok(StartOutcome::Run { attempts }) => attempts,
            Ok(StartOutcome::Busy) => {
                self.schedule(plan, now_ms + RESOURCE_BUSY_RETRY_MS);
                return;
            }
            Ok(StartOutcome::Lost) | Ok(StartOutcome::Invalidated) => {
                self.forget();
                return;
            }
            Err(e) => {
                tracing::warn!(plan = %plan.plan_id, error = %e, "cannot start a run; trying again");
                self.schedule(plan, now_ms + STORE_ERROR_RETRY_MS);
                return;
            }
        };

        let started_at_ms = self.clock.now_ms();
        let result = match &action {
            Ok(Action::Webhook(webhook)) => {
                let ctx = CallContext {
                    life_uuid: &uuid,
                    plan: kind.as_str(),
                    execution_count: attempts,
                    fire_at_ms: plan.fire_at_ms,
                    resource_id: plan.resource_id.as_deref(),
                };
                self.webhook.call(webhook, &ctx).await
            }
            Ok(Action::Plugin(p)) => CallResult {
                status: None,
                error: Some(format!(
                    "plugin `{}`: this host has no plugin runtime yet",
                    p.plugin
                )),
            },
            Err(e) => CallResult {
                status: None,
                error: Some(e.clone()),
            },
        };
        let finished_at_ms = self.clock.now_ms();
        let (outcome, word) = decide(
            &result,
            attempts,
            action.as_ref().ok(),
            kind,
            &self.config.execution_retry_codes,
            self.config.death_retry_interval.as_millis() as i64,
            finished_at_ms,
        );
        if result.error.is_some() {
            tracing::info!(plan = %plan.plan_id, attempts, outcome = word, error = ?result.error, "run did not succeed");
        }
        let record = RunRecord {
            plan: kind,
            should_run_at_ms: plan.fire_at_ms,
            started_at_ms,
            duration_ms: (finished_at_ms - started_at_ms).max(0) as u64,
            host: self.host_id.clone(),
            outcome: word,
            status: result.status,
            error: result.error.clone(),
            attempt: attempts,
        };
        self.record_finish(&plan, &uuid, &outcome, &record).await;
        self.forget();
    }

    /// Writes the outcome, retrying while Redis is away. Gives up after the lease time:
    /// by then the supervisor of another host may have taken the Plan over, and it will
    /// run again (at-least-once).
    async fn record_finish(
        &self,
        plan: &Claimed,
        uuid: &str,
        outcome: &RunOutcome,
        record: &RunRecord,
    ) {
        let give_up = tokio::time::Instant::now() + self.config.lease_ttl;
        let mut pause = Duration::from_millis(50);
        loop {
            let now_ms = self.clock.now_ms();
            match self
                .store
                .finish_run(
                    &self.host_id,
                    plan,
                    uuid,
                    outcome,
                    record,
                    now_ms,
                    self.notify_before_ms(),
                )
                .await
            {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!(plan = %plan.plan_id, "the Plan was taken over while it ran; its run is recorded, its state left to the new holder");
                    return;
                }
                Err(e) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(plan = %plan.plan_id, error = %e, "cannot record a finished run; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(plan = %plan.plan_id, error = %e, "gave up recording a finished run; the Plan will run again after its lease expires");
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
        };
        assert_eq!(d(&refused, 1, PlanKind::Birth), RunOutcome::Failed);
    }
}
