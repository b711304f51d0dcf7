//! Starting fired Plans: a batch is fenced in `start_run` calls (one for every shard on a
//! standalone Redis, one per shard on a Redis Cluster), and the runs that may go are
//! spawned, each holding its worker slot while its action runs.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::Finished;
use crate::actions::Fence;
use crate::engine::{Engine, LeaseToken};
use crate::model::{Action, PlanKind};
use crate::store::{Claimed, Owner, StartOutcome, StartSection};

/// Pause before a Plan whose resource is busy tries again.
const RESOURCE_BUSY_RETRY_MS: i64 = 50;
/// Pause before a Plan whose start could not reach Redis tries again.
const STORE_ERROR_RETRY_MS: i64 = 500;
/// Pause before a Plan refused because this host's lease ran out tries again (the
/// heartbeat renews the lease meanwhile).
const LEASE_EXPIRED_RETRY_MS: i64 = 200;

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
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
    }
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
}
