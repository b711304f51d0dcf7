//! Recording finished runs: the finisher's lanes write outcomes in batches, with the
//! callbacks they book, retrying while Redis is away.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::engine::Engine;
use crate::model::Action;
use crate::store::{Callback, FinishedRun, Owner, RunOutcome};

/// Most runs one `finish_run` call records.
const FINISH_BATCH: usize = 256;
/// A lane whose batch held at least `LINGER_FROM` runs waits `FINISH_LINGER` before it
/// takes the next one (group commit under load): on a standalone Redis a finish call
/// carries each shard's runs as a section, and a section costs Redis about the same
/// whether it carries one run or ten, so more runs a call means less Redis a run. A
/// lane under light load never waits.
const LINGER_FROM: usize = 32;
const FINISH_LINGER: Duration = Duration::from_millis(4);
/// Least time recording an outcome is retried while Redis is away (a restart of Redis
/// takes seconds).
const RECORD_PATIENCE: Duration = Duration::from_secs(30);

/// A run waiting for its outcome to be written.
pub(crate) struct Finished {
    pub(super) run: FinishedRun,
}

impl Engine {
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
            if batch.len() >= LINGER_FROM {
                tokio::time::sleep(FINISH_LINGER).await;
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

    /// Records a lane's finished Life runs in one `finish_life` call (retried while
    /// Redis is away), with the callbacks they book.
    async fn record_lives(&self, mut runs: Vec<FinishedRun>) {
        for run in &mut runs {
            self.attach_callback(run);
        }
        let runs = &runs;
        let held = self
            .retry_store("lives", || async move {
                let now_ms = self.clock.now_ms();
                self.store
                    .finish_lives(&self.host_id, runs, now_ms, self.notify_before_ms())
                    .await
            })
            .await;
        for (run, held) in runs.iter().zip(held.unwrap_or_default()) {
            if !held {
                tracing::warn!(plan = %run.plan.plan_id, "the Plan was taken over while it ran; its run is recorded, its state left to the new holder");
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
