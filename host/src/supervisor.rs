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

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::scheduler::{until_shutdown, Engine, ShutdownSignal};
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

/// A shard this host owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owned {
    /// The lease's generation: claims and starts go under it.
    pub gen: u64,
    /// Being given up: no new claims or starts.
    pub draining: bool,
}

/// The shards this host owns.
#[derive(Default)]
pub(crate) struct ShardTable {
    owned: Mutex<HashMap<u32, Owned>>,
}

impl ShardTable {
    /// The generation to claim and start under, for a shard owned and not draining.
    pub(crate) fn active_gen(&self, shard: u32) -> Option<u64> {
        self.owned
            .lock()
            .expect("shard table lock")
            .get(&shard)
            .filter(|o| !o.draining)
            .map(|o| o.gen)
    }

    /// Shards owned and not draining, in order.
    pub(crate) fn active(&self) -> Vec<(u32, u64)> {
        let owned = self.owned.lock().expect("shard table lock");
        let mut out: Vec<(u32, u64)> = owned
            .iter()
            .filter(|(_, o)| !o.draining)
            .map(|(s, o)| (*s, o.gen))
            .collect();
        out.sort();
        out
    }

    /// Every shard owned, draining or not.
    pub(crate) fn all(&self) -> Vec<(u32, Owned)> {
        let owned = self.owned.lock().expect("shard table lock");
        let mut out: Vec<(u32, Owned)> = owned.iter().map(|(s, o)| (*s, *o)).collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    fn insert(&self, shard: u32, gen: u64) {
        self.owned.lock().expect("shard table lock").insert(
            shard,
            Owned {
                gen,
                draining: false,
            },
        );
    }

    fn drain(&self, shard: u32) {
        if let Some(o) = self.owned.lock().expect("shard table lock").get_mut(&shard) {
            o.draining = true;
        }
    }

    pub(crate) fn remove(&self, shard: u32) -> Option<Owned> {
        self.owned.lock().expect("shard table lock").remove(&shard)
    }

    pub(crate) fn len(&self) -> usize {
        self.owned.lock().expect("shard table lock").len()
    }
}

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
            self.keep_shards(stopping).await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.renew_now.notified() => {}
                _ = until_shutdown(&mut stopped) => return,
            }
        }
    }

    /// One look at the shards.
    pub(crate) async fn keep_shards(&self, stopping: bool) {
        let started_ms = crate::scheduler::wall_ms();
        let lease_ms = self.lease_ms();
        let live = match self
            .store
            .announce_host(&self.host_id, started_ms, started_ms + lease_ms)
            .await
        {
            Ok(live) => live,
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "cannot reach Redis to keep this host's shards");
                return;
            }
        };
        // Renew every lease held, draining ones included (their runs are still going).
        let held: Vec<(u32, u64)> = self
            .shards
            .all()
            .into_iter()
            .map(|(s, o)| (s, o.gen))
            .collect();
        match self.store.shard_renew(&self.host_id, &held, lease_ms).await {
            Ok(kept) => {
                for ((shard, _), kept) in held.iter().zip(kept) {
                    if !kept {
                        tracing::warn!(
                            shard,
                            "this host's lease on the shard was taken over; dropping it"
                        );
                        self.drop_shard(*shard);
                    }
                }
                self.lease_renewed(started_ms, started_ms + lease_ms);
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "cannot renew this host's shard leases");
                return;
            }
        }
        if stopping {
            return;
        }
        let wanted: BTreeSet<u32> = (0..self.store.shard_count())
            .filter(|&s| preferred_host(s, &live) == Some(self.host_id.as_str()))
            .collect();
        let owned: BTreeSet<u32> = self.shards.all().into_iter().map(|(s, _)| s).collect();
        for &shard in wanted.difference(&owned) {
            self.take_shard(shard).await;
        }
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
                self.finish_draining(shard, o.gen).await;
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
        let recovering = crate::scheduler::wall_ms().saturating_sub(outage_ms) < self.lease_ms();
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
        self.shards.insert(shard, gen);
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
            crate::scheduler::wall_ms(),
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
        for (shard, _) in self.shards.active() {
            let names = match self.store.shard_queue_names(shard).await {
                Ok(names) => names,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list queues to wake their waiting tasks");
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
    }

    /// Hands back the Plans held in this host's shards that it does not track in memory:
    /// a claim or start whose reply was lost, an outcome it could not record. Nothing in
    /// memory would ever fire or finish them, and a live host's lease never expires. Each
    /// goes back only under the claim that is lost (never a newer claim of the same Plan),
    /// and the claim gate keeps a claim pass from being caught half-way; a stale timer
    /// entry of a Plan handed back fails its fence at start, so this never runs a Plan
    /// twice at once.
    pub(crate) async fn audit_held(&self) {
        for (shard, _) in self.shards.active() {
            let gate = self.claim_gate.lock().await;
            let held = match self
                .store
                .held_due_before(shard, self.clock.now_ms() - AUDIT_GRACE_MS, AUDIT_BATCH)
                .await
            {
                Ok(held) => held,
                Err(e) => {
                    self.store_failed();
                    tracing::warn!(error = %e, "cannot audit held Plans");
                    return;
                }
            };
            let orphans: Vec<(String, String)> = held
                .into_iter()
                .filter(|(id, claim)| !self.tracks(id, claim))
                .collect();
            drop(gate);
            if orphans.is_empty() {
                continue;
            }
            match self
                .store
                .release(
                    shard,
                    &self.host_id,
                    &orphans,
                    self.notify_before_ms(),
                    i64::MAX,
                )
                .await
            {
                Ok(moved) => tracing::warn!(
                    shard,
                    plans = moved,
                    "handed back held Plans this host no longer tracked"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot hand back orphaned Plans"),
            }
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
        for (shard, _) in self.shards.active() {
            loop {
                match self.store.sweep(shard, cutoff, SWEEP_BATCH).await {
                    Ok(n) if (n as usize) < SWEEP_BATCH => {
                        if n > 0 {
                            tracing::info!(shard, lives = n, "swept finished Lives past retention");
                        }
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "sweep failed");
                        return;
                    }
                }
            }
        }
    }
}
