//! The Supervisor role: which shards this host works, and the upkeep of those shards.
//!
//! - **Shard keeper**: every quarter lease (at most every second) announces this host in
//!   `hosts`, renews its lease on each shard it owns, and compares what it owns with what
//!   it should own: every host ranks the live hosts for each shard by the same hash
//!   (rendezvous hashing), so all agree on the split without talking to each other. A
//!   shard it should own is taken when its lease is free or has run out (a dead or
//!   frozen owner); the Plans its predecessor had claimed go back to the due sets first.
//!   A shard it should no longer own (a host joined) is drained: no more claims or
//!   starts, runs under way finish, then the lease is given up and the shard's new host
//!   takes it at its next look. A shard whose renewal finds another owner is dropped at
//!   once: its Plans are the other host's now.
//! - **Upkeep** of owned shards: the self-audit of held Plans, the queues' waiting tasks,
//!   the retention sweep.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{until_shutdown, Engine, ShutdownSignal};
use crate::store::{preferred_host, Takeover};

/// Lives deleted by one sweep call.
const SWEEP_BATCH: usize = 500;
/// Longest pause between two sweeps of finished Lives; a short retention sweeps more
/// often (a quarter of it, at least every second).
const SWEEP_EVERY_MAX: Duration = Duration::from_secs(60);
/// Longest pause between two looks at the shards: with the lease, it bounds how late a
/// crashed host's Plans fire.
const KEEP_EVERY_MAX: Duration = Duration::from_secs(1);
/// Pause between two looks at the queues' waiting tasks (queue_wake).
const QUEUE_WAKE_EVERY: Duration = Duration::from_secs(2);
/// Most Plans one audit looks at, per shard.
const AUDIT_BATCH: usize = 1000;
/// The audit looks only at Plans held this long past their fire time. A Plan this host
/// tracks fires at its time; an orphan stays held for good, so it is found a little later
/// instead of every held Plan's claim being read every pass (during a burst of 100,000
/// Plans that was 0.9 extra Redis reads per fire).
const AUDIT_GRACE_MS: i64 = 2_000;
/// Longest one look at a shard's sweep may take before the supervisor goes on.
const SWEEP_PATIENCE: Duration = Duration::from_secs(10);
/// The audit reads a shard's Lives' claims in full once in this many seconds (otherwise
/// only when the shard holds more of them than the host tracks).
const FULL_AUDIT_EVERY: i64 = 30;
const AUDIT_EVERY_MS: i64 = 1_000;
/// Longest one shard's audit may take before the others go on without it.
const AUDIT_PATIENCE: Duration = Duration::from_secs(1);
/// Plans handed back per shard_release call.
const RELEASE_BATCH: usize = 1000;
/// Pause between two looks at how full Redis is.
const MEMORY_LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often the history's size is estimated, under `--history-max-bytes`.
const HISTORY_SIZE_EVERY: Duration = Duration::from_secs(10);
/// Finished Lives sampled per shard for that estimate.
const HISTORY_SAMPLE: usize = 16;
/// The same once some shard's Redis is past `MEMORY_CLOSE_AT` thousandths of its
/// maxmemory: bookings arriving at full speed must not outrun the look.
const MEMORY_LOOK_EVERY_CLOSE: Duration = Duration::from_millis(100);
const MEMORY_CLOSE_AT: u32 = 800;
/// Pause between two complaints about an evicting maxmemory-policy set while running.
const EVICTION_WARN_EVERY: Duration = Duration::from_secs(60);

impl Engine {
    /// Keeps this host's shards: see the module docs. Runs until `stopped` (after the
    /// last hand-back at shutdown); from `shutdown` on, it takes no more shards.
    pub(crate) async fn shard_keeper(
        self: Arc<Self>,
        shutdown: ShutdownSignal,
        mut stopped: ShutdownSignal,
    ) {
        let every = (self.config.lease_ttl / 4).min(KEEP_EVERY_MAX);
        loop {
            let stopping = *shutdown.borrow();
            // A quarter lease from one look's start to the next, however long a master
            // that does not answer kept this one waiting.
            let next = tokio::time::Instant::now() + every;
            self.keep_shards(stopping).await;
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = self.renew_now.notified() => {}
                _ = until_shutdown(&mut stopped) => return,
            }
        }
    }

    /// One look at the shards. Each shard's lease is renewed on its own, within a
    /// quarter lease: a master that does not answer costs the leases of its own shards,
    /// never the others' (nor this look's next turn). The host's announcement goes to
    /// whichever master holds `hosts`, at the same time as the renewals and not before
    /// them: while that master was down, each look waited a quarter lease for it first,
    /// and the leases of every shard, renewed that much later from the look's start,
    /// fell short of the quarter to spare that a run's fence asks for.
    pub(crate) async fn keep_shards(&self, stopping: bool) {
        let started_ms = crate::engine::wall_ms();
        let lease_ms = self.lease_ms();
        let patience = Duration::from_millis((lease_ms / 4).max(100) as u64);
        // Renew every lease held, draining ones included (their runs are still going).
        let held: Vec<(u32, u64)> = self
            .shards
            .all()
            .into_iter()
            .map(|(s, o)| (s, o.gen))
            .collect();
        let (announced, renewed) = tokio::join!(
            tokio::time::timeout(
                patience,
                self.store
                    .announce_host(&self.host_id, started_ms, started_ms + lease_ms),
            ),
            self.store
                .shard_renew(&self.host_id, &held, lease_ms, patience)
        );
        let live = match announced {
            Ok(Ok(live)) => {
                self.heard_from_redis(started_ms);
                Some(live)
            }
            Ok(Err(e)) => {
                self.store_failed();
                tracing::warn!(error = %e, "cannot announce this host; its leases are renewed all the same");
                None
            }
            Err(_) => {
                self.store_failed();
                tracing::warn!(
                    "announcing this host timed out; its leases are renewed all the same"
                );
                None
            }
        };
        let mut failed = Vec::new();
        for ((shard, _), kept) in held.iter().zip(renewed) {
            match kept {
                Ok(true) => self.lease_renewed(*shard, started_ms, started_ms + lease_ms),
                Ok(false) => {
                    tracing::warn!(
                        shard,
                        "this host's lease on the shard was taken over; dropping it"
                    );
                    self.drop_shard(*shard);
                }
                Err(e) => failed.push((*shard, e)),
            }
        }
        if let Some((_, e)) = failed.first() {
            self.store_failed();
            let shards: Vec<u32> = failed.iter().map(|(s, _)| *s).collect();
            tracing::warn!(error = %e, ?shards, "cannot renew this host's leases on these shards; the others are renewed");
        }
        if stopping {
            return;
        }
        // Without this look's list of live hosts, the split stays as it is: taking or
        // giving up shards waits for the next look that can read it.
        let Some(live) = live else { return };
        let wanted: BTreeSet<u32> = (0..self.store.shard_count())
            .filter(|&s| preferred_host(s, &live) == Some(self.host_id.as_str()))
            .collect();
        let owned: BTreeSet<u32> = self.shards.all().into_iter().map(|(s, _)| s).collect();
        let takes = wanted
            .difference(&owned)
            .map(|&shard| tokio::time::timeout(patience, self.take_shard(shard)));
        futures_util::future::join_all(takes).await;
        for (shard, o) in self.shards.all() {
            if !wanted.contains(&shard) {
                if !o.draining {
                    tracing::info!(
                        shard,
                        "another host should work this shard now; draining it"
                    );
                    self.shards.drain(shard);
                    self.forget_shard(shard);
                }
                let _ = tokio::time::timeout(patience, self.finish_draining(shard, o.gen)).await;
            }
        }
    }

    /// Takes a shard whose lease is free or has run out, and hands back what its
    /// previous owner had claimed before claiming anything.
    async fn take_shard(&self, shard: u32) {
        // Just after Redis was away (a restart), every lease may have run out while
        // its live owner could not renew: leave other hosts' shards alone for a lease
        // period so that they can.
        let outage_ms = self
            .last_store_error_ms
            .load(std::sync::atomic::Ordering::Acquire);
        let recovering = crate::engine::wall_ms().saturating_sub(outage_ms) < self.lease_ms();
        if recovering {
            match self.store.shard_owner(shard).await {
                Ok(Some(owner)) if !owner.host.is_empty() && owner.host != self.host_id => return,
                Ok(_) => {}
                Err(_) => return,
            }
        }
        let taken = self
            .store
            .shard_takeover(shard, &self.host_id, self.lease_ms())
            .await;
        let (gen, previous) = match taken {
            Ok(Takeover::Taken { gen, previous }) => (gen, previous),
            Ok(Takeover::HeldBy(_)) => return,
            Err(e) => {
                self.store_failed();
                tracing::warn!(shard, error = %e, "cannot take a shard over");
                return;
            }
        };
        let (moved, released) = self.release_held(shard, gen, false).await;
        if let Err(e) = released {
            // The shard is ours; what is left is handed back by the audit.
            tracing::warn!(shard, error = %e, "cannot hand back the previous owner's Plans yet");
        }
        self.metrics
            .plans_reclaimed
            .fetch_add(moved as u64, std::sync::atomic::Ordering::Relaxed);
        if previous == self.host_id && moved > 0 {
            tracing::warn!(
                shard,
                gen,
                plans = moved,
                "handed back the Plans an earlier process with this host id left held"
            );
        } else if previous.is_empty() || previous == self.host_id {
            tracing::debug!(shard, gen, plans = moved, "took a shard");
        } else {
            self.metrics
                .shard_takeovers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(shard, gen, from = %previous, plans = moved, "took over a shard whose lease had run out; its claimed Plans are back in the due set");
        }
        self.shards
            .insert(shard, gen, crate::engine::wall_ms() + self.lease_ms());
        self.mark_dirty(shard);
    }

    /// Gives a draining shard up once none of its runs is still going on this host.
    async fn finish_draining(&self, shard: u32, gen: u64) {
        if self.busy_in(shard) > 0 {
            return;
        }
        self.forget_shard(shard);
        if self.give_up_shard(shard, gen).await.is_some() {
            self.shards.remove(shard);
            tracing::info!(shard, "gave the shard up");
        }
    }

    /// Hands every Plan held in a shard back and gives its lease up; the number of Plans
    /// moved when done (or when the shard is not this host's any more), None when Redis
    /// could not be reached.
    pub(crate) async fn give_up_shard(&self, shard: u32, gen: u64) -> Option<i64> {
        match self.release_held(shard, gen, true).await {
            (moved, Ok(true)) => Some(moved),
            (_, Ok(false)) => None,
            (_, Err(e)) => {
                tracing::warn!(shard, error = %e, "cannot give the shard up yet");
                None
            }
        }
    }

    /// Puts every Plan held in a shard back in its due set, RELEASE_BATCH at a time (and
    /// gives the lease up with the last batch when `give_up`). Returns how many moved,
    /// and whether all were moved (false after 100,000 batches), or the error that
    /// stopped it.
    async fn release_held(
        &self,
        shard: u32,
        gen: u64,
        give_up: bool,
    ) -> (i64, Result<bool, redis::RedisError>) {
        let mut moved = 0;
        for _ in 0..100_000 {
            match self
                .store
                .shard_release(
                    shard,
                    &self.host_id,
                    gen,
                    RELEASE_BATCH,
                    self.notify_before_ms(),
                    give_up,
                    self.clock.now_ms(),
                )
                .await
            {
                Ok((n, left)) => {
                    moved += n.max(0);
                    if left <= 0 {
                        return (moved, Ok(true));
                    }
                }
                Err(e) => return (moved, Err(e)),
            }
        }
        (moved, Ok(false))
    }

    /// Drops a shard that another host owns now: its Plans in memory are that host's
    /// (runs under way finish; their outcome is fenced).
    pub(crate) fn drop_shard(&self, shard: u32) {
        self.shards.remove(shard);
        self.forget_shard(shard);
    }

    /// Notes that Redis could not be reached just now (see `last_store_error_ms`).
    pub(crate) fn store_failed(&self) {
        self.last_store_error_ms.store(
            crate::engine::wall_ms(),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// Upkeep of the shards this host owns.
    pub(crate) async fn supervisor(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let every = (self.config.lease_ttl / 4).min(KEEP_EVERY_MAX);
        let sweep_every =
            (self.config.history_retention / 4).clamp(Duration::from_secs(1), SWEEP_EVERY_MAX);
        let mut last_sweep = tokio::time::Instant::now() - sweep_every;
        let mut last_wake = tokio::time::Instant::now() - QUEUE_WAKE_EVERY;
        loop {
            self.audit_held().await;
            if last_wake.elapsed() >= QUEUE_WAKE_EVERY {
                last_wake = tokio::time::Instant::now();
                self.wake_queues().await;
            }
            if last_sweep.elapsed() >= sweep_every {
                last_sweep = tokio::time::Instant::now();
                self.sweep_finished().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(every.min(sweep_every)) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }

    /// Gives every running queue's free slots to its waiting tasks: a safety net under
    /// the wake-ups of finish_task and resume (a crash between them, a raised limit).
    /// Each host looks after the queues of its own shards.
    async fn wake_queues(&self) {
        // Shard by shard at once: a master that does not answer holds up no other's.
        let wakes =
            self.shards.active().into_iter().map(|(shard, _)| {
                tokio::time::timeout(AUDIT_PATIENCE, self.wake_shard_queues(shard))
            });
        futures_util::future::join_all(wakes).await;
    }

    async fn wake_shard_queues(&self, shard: u32) {
        let names = match self.store.shard_queue_names(shard).await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(shard, error = %e, "cannot list queues to wake their waiting tasks");
                return;
            }
        };
        for name in names {
            if let Err(e) = self.store.queue_wake(&name, self.notify_before_ms()).await {
                tracing::warn!(queue = %name, error = %e, "cannot wake the queue's waiting tasks");
                return;
            }
        }
    }

    /// Hands back the Plans held in this host's shards that it does not track in memory:
    /// a claim or start whose reply was lost, an outcome it could not record. Nothing in
    /// memory would ever fire or finish them, and a live host's lease never expires. Each
    /// goes back only under the claim that is lost (never a newer claim of the same Plan),
    /// and the claim gate keeps a claim pass from being caught half-way; a stale timer
    /// entry of a Plan handed back fails its fence at start, so this never runs a Plan
    /// twice at once.
    pub(crate) async fn audit_held(&self) {
        // Every shard at once, each within a second: a master that does not answer
        // holds up the audit of no other shard.
        let audits = self
            .shards
            .active()
            .into_iter()
            .map(|(shard, _)| tokio::time::timeout(AUDIT_PATIENCE, self.audit_shard(shard)));
        futures_util::future::join_all(audits).await;
    }

    /// The audit of one shard (see [`audit_held`](Self::audit_held)).
    pub(crate) async fn audit_shard(&self, shard: u32) {
        let gate = self.claim_gate(shard);
        let gate = gate.lock().await;
        let now_ms = self.clock.now_ms();
        // Lives' claims are read only when the shard holds more than this host tracks
        // (an entry of a finished run counts until its Plan is forgotten, so an orphan
        // may hide behind it for a moment), and in full every FULL_AUDIT_EVERY audits.
        let full = (now_ms / AUDIT_EVERY_MS + i64::from(shard)) % FULL_AUDIT_EVERY == 0;
        let tracked = (!full).then(|| self.tracked_lives(shard));
        let held = match self
            .store
            .held_due_before(
                shard,
                &self.host_id,
                now_ms - AUDIT_GRACE_MS,
                AUDIT_BATCH,
                tracked,
            )
            .await
        {
            Ok(held) => held,
            Err(e) => {
                self.store_failed();
                tracing::warn!(shard, error = %e, "cannot audit held Plans");
                return;
            }
        };
        let orphans: Vec<(String, String)> = held
            .into_iter()
            .filter(|(id, claim)| !self.tracks(id, claim))
            .collect();
        drop(gate);
        if orphans.is_empty() {
            return;
        }
        match self
            .store
            .release(
                shard,
                &self.host_id,
                &orphans,
                self.notify_before_ms(),
                i64::MAX,
                self.clock.now_ms(),
            )
            .await
        {
            Ok(moved) => tracing::warn!(
                shard,
                plans = moved,
                "handed back held Plans this host no longer tracked"
            ),
            Err(e) => tracing::warn!(shard, error = %e, "cannot hand back orphaned Plans"),
        }
    }

    /// Looks at how full each shard's Redis is (see `store::memory`): records it for the
    /// booking routes, and sheds the oldest history of the shards this host owns whose
    /// Redis is past `SHED_AT`; and keeps their history within `--history-max-lives`.
    pub(crate) async fn memory_watch(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let mut last_warning: Option<tokio::time::Instant> = None;
        let mut last_sized: Option<tokio::time::Instant> = None;
        loop {
            let close = match self.store.read_memory().await {
                Ok(seen) => {
                    self.store.memory().record(&seen);
                    if let Some(m) = seen.iter().find(|m| m.may_evict()) {
                        if !self.config.allow_eviction
                            && last_warning.is_none_or(|t| t.elapsed() >= EVICTION_WARN_EVERY)
                        {
                            last_warning = Some(tokio::time::Instant::now());
                            tracing::error!(policy = %m.policy, "Redis's maxmemory-policy was changed to one that may evict keys: pending bookings and resource locks can be lost when it is full; set it back to noeviction");
                        }
                    }
                    self.shed_history().await;
                    seen.iter().any(|m| m.permille() >= MEMORY_CLOSE_AT)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read Redis's INFO memory");
                    false
                }
            };
            self.trim_history().await;
            if last_sized.is_none_or(|t| t.elapsed() >= HISTORY_SIZE_EVERY) {
                last_sized = Some(tokio::time::Instant::now());
                self.trim_history_bytes().await;
            }
            let pause = if close {
                MEMORY_LOOK_EVERY_CLOSE
            } else {
                MEMORY_LOOK_EVERY
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }

    /// Deletes a batch of the oldest finished Lives of each owned shard whose Redis is
    /// past `SHED_AT`, whatever their retention: history goes before bookings are refused.
    async fn shed_history(&self) {
        let memory = self.store.memory();
        for (shard, _) in self.shards.active() {
            let permille = memory.permille(shard);
            if permille < crate::store::SHED_AT {
                continue;
            }
            match self
                .store
                .sweep(shard, self.clock.now_ms(), SWEEP_BATCH)
                .await
            {
                Ok(0) => {}
                Ok(n) => {
                    memory
                        .shed
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        shard,
                        lives = n,
                        full_permille = permille,
                        "Redis is nearly full: shed the oldest finished Lives before their retention"
                    );
                }
                Err(e) => tracing::warn!(shard, error = %e, "cannot shed history"),
            }
        }
    }

    /// Keeps each owned shard's history within its share of `--history-max-lives`,
    /// deleting the oldest finished Lives first.
    async fn trim_history(&self) {
        let Some(max) = self.config.history_max_lives else {
            return;
        };
        let keep = max.div_ceil(self.store.shard_count() as u64);
        for (shard, _) in self.shards.active() {
            let excess = match self.store.history_excess(shard, keep, SWEEP_BATCH).await {
                Ok(Some(excess)) => excess,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot count the history");
                    continue;
                }
            };
            let (cutoff_ms, count) = excess;
            match self.store.sweep(shard, cutoff_ms, count).await {
                Ok(n) if n > 0 => {
                    tracing::debug!(shard, lives = n, keep, "trimmed the history to its count")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(shard, error = %e, "cannot trim the history"),
            }
        }
    }

    /// Keeps each owned shard's history within its share of `--history-max-bytes`,
    /// deleting the oldest finished Lives first. The size is an estimate from a sample
    /// (`Store::history_size`), so the bound holds to within the sample's error.
    async fn trim_history_bytes(&self) {
        let Some(max) = self.config.history_max_bytes else {
            return;
        };
        let budget = max / self.store.shard_count() as u64;
        for (shard, _) in self.shards.active() {
            let (lives, bytes) = match self.store.history_size(shard, HISTORY_SAMPLE).await {
                Ok(size) => size,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot size the history");
                    continue;
                }
            };
            tracing::debug!(shard, lives, bytes, budget, "sized the history");
            if bytes <= budget || lives == 0 {
                continue;
            }
            let per_life = (bytes / lives).max(1);
            let keep = lives.saturating_sub((bytes - budget).div_ceil(per_life));
            let Ok(Some((cutoff_ms, count))) =
                self.store.history_excess(shard, keep, SWEEP_BATCH).await
            else {
                continue;
            };
            match self.store.sweep(shard, cutoff_ms, count).await {
                Ok(n) if n > 0 => {
                    tracing::debug!(
                        shard,
                        lives = n,
                        bytes,
                        budget,
                        "trimmed the history to its size"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(shard, error = %e, "cannot trim the history"),
            }
        }
    }

    async fn sweep_finished(&self) {
        let cutoff = self.clock.now_ms() - self.config.history_retention.as_millis() as i64;
        // Shard by shard at once: a master that does not answer holds up no other's
        // sweep (what one pass leaves, the next takes).
        let sweeps = self
            .shards
            .active()
            .into_iter()
            .map(|(shard, _)| async move {
                loop {
                    match self.store.sweep(shard, cutoff, SWEEP_BATCH).await {
                        Ok(n) if (n as usize) < SWEEP_BATCH => {
                            if n > 0 {
                                tracing::info!(
                                    shard,
                                    lives = n,
                                    "swept finished Lives past retention"
                                );
                            }
                            return;
                        }
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(shard, error = %e, "sweep failed");
                            return;
                        }
                    }
                }
            });
        let sweeps = sweeps.map(|sweep| tokio::time::timeout(SWEEP_PATIENCE, sweep));
        futures_util::future::join_all(sweeps).await;
    }
}
