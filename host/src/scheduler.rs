//! The Scheduler role: claims Plans due within the look-ahead window
//! (`preset_execution_time`) from Redis into an in-memory timer, and hands each one to the
//! worker pool at its fire time.
//!
//! - **Claimer**: runs the `claim` script on each shard this host owns at least every
//!   `booking_plan_watch_interval`, and on one shard at once when that shard's `notify`
//!   channel says a Plan became due inside the window (a new booking, a retry, a Plan
//!   taken back from a dead host). It claims nothing while the queue of fired Plans is
//!   full or `max_claimed` Plans are already in memory, so pressure stops claiming
//!   instead of dropping work.
//! - **Timer**: a `BTreeMap` ordered by (fire time, sequence) and a dispatcher task that
//!   sleeps until the earliest entry, woken early through a `Notify` when an earlier
//!   entry arrives.
//! - **Queue**: a bounded channel of `timedout_queue_max_size` fired Plans; a pool of
//!   `workers` concurrent runs drains it (`executor.rs`).
//!
//! **Architecture invariant:** a claimed Plan stays under its shard's lease (Preset in
//! Redis, member of the shard's `held`) until `finish_run` or a hand-back releases it, so
//! a crash at any point leaves it to the host that takes the shard over.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::engine::{
    until_shutdown, wall_ms, Engine, LeaseToken, ShutdownSignal, WaitingRuns, START_BATCH,
};
use crate::store::{ClaimReply, Claimed};

/// Most Plans one `claim` call moves.
const CLAIM_BATCH: usize = 1000;
/// How far ahead queue tasks are claimed: they may still have to wait for their queue's
/// tokens, and a backlog waits in Redis (`due_tasks`), not in a host's memory.
const TASK_LOOKAHEAD_MS: i64 = 1000;

impl Engine {
    /// Asks the claimer for a pass over every shard it works now, and the dispatcher to
    /// look at the time again: the clock has moved ahead.
    pub(crate) fn clock_moved(&self) {
        let active = self.shards.active();
        self.clock_moved_for(active.into_iter().map(|(s, _)| s));
    }

    /// As [`clock_moved`](Self::clock_moved), claiming only from `shards` (those with
    /// something due by the new time; a step of the manual clock knows which).
    pub(crate) fn clock_moved_for(&self, shards: impl IntoIterator<Item = u32>) {
        self.dirty.lock().expect("dirty lock").extend(shards);
        self.claim_wakeup.notify_one();
        self.timer_wakeup.notify_one();
    }

    /// Whether this host has work of its own under way by `now_ms`: a claim pass asked
    /// for, a timer entry due, or a Plan out of the timer (fired and waiting for a
    /// worker, starting, running, or waiting for its outcome to be recorded).
    pub(crate) fn busy_by(&self, now_ms: i64) -> bool {
        if !self.dirty.lock().expect("dirty lock").is_empty()
            || !self.claiming.lock().expect("claiming lock").is_empty()
        {
            return true;
        }
        let timer = self.timer.lock().expect("timer lock");
        let due = timer.first_key_value().is_some_and(|(k, _)| k.0 <= now_ms);
        let in_timer = timer.len();
        drop(timer);
        due || self.claimed() > in_timer
    }

    /// Puts a claimed Plan (back) into the timer.
    pub(crate) fn schedule(&self, plan: Claimed, at_ms: i64) {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let mut timer = self.timer.lock().expect("timer lock");
        let earliest = timer.first_key_value().map(|(k, _)| k.0);
        timer.insert((at_ms, seq), Box::new(plan));
        drop(timer);
        if earliest.is_none_or(|e| at_ms < e) {
            self.timer_wakeup.notify_one();
        }
    }

    /// A claimed Plan entered this host's memory.
    fn track(&self, plan: &Claimed) {
        self.tracked.lock().expect("tracked lock").track(plan);
    }

    /// A Plan left this host's memory (finished, lost or handed back).
    pub(crate) fn forget(&self, plan: &Claimed) {
        self.tracked.lock().expect("tracked lock").forget(plan);
        self.room_freed();
    }

    /// Room came free (a Plan left memory, or the worker pool took fired Plans off a
    /// full queue): a claimer that stopped for want of it claims again now rather than
    /// at its next watch interval.
    fn room_freed(&self) {
        if self.starved.swap(false, Ordering::AcqRel) {
            self.claim_wakeup.notify_one();
        }
    }

    /// A tracked Plan is about to be started: its shard is not given up until its start
    /// is answered and, if it runs, its outcome recorded. False when it is no longer
    /// tracked (a drain of its shard let go of it): it must not start here.
    pub(crate) fn mark_starting(&self, plan: &Claimed) -> bool {
        self.tracked
            .lock()
            .expect("tracked lock")
            .set_busy(plan, true)
    }

    /// A Plan whose start was put off: back into the timer for `at_ms`, and no longer
    /// busy (a drain of its shard need not wait for it).
    pub(crate) fn put_off(&self, plan: Claimed, at_ms: i64) {
        self.tracked
            .lock()
            .expect("tracked lock")
            .set_busy(&plan, false);
        self.schedule(plan, at_ms);
    }

    /// Starts and runs of `shard` under way on this host.
    pub(crate) fn busy_in(&self, shard: u32) -> usize {
        self.tracked.lock().expect("tracked lock").busy_in(shard)
    }

    /// Lets go of a shard's Plans in memory that are not starting or running: off the
    /// timer and out of `tracked` (fired ones waiting for a worker are dropped when they
    /// reach it, as the shard is no longer active). Starts and runs under way are left
    /// to finish.
    pub(crate) fn forget_shard(&self, shard: u32) {
        self.timer
            .lock()
            .expect("timer lock")
            .retain(|_, plan| plan.shard != shard);
        let gone = self
            .tracked
            .lock()
            .expect("tracked lock")
            .let_go_of_shard(shard);
        self.dirty.lock().expect("dirty lock").remove(&shard);
        self.next_task_ms
            .lock()
            .expect("next task lock")
            .remove(&shard);
        if gone > 0 {
            tracing::debug!(shard, plans = gone, "let go of a shard's claimed Plans");
            self.wake_claimer();
        }
    }

    /// A shard's notify channel spoke: claim from it at the next pass.
    pub(crate) fn mark_dirty(&self, shard: u32) {
        self.dirty.lock().expect("dirty lock").insert(shard);
        self.claim_wakeup.notify_one();
    }

    /// Whether this host tracks this claim of a Plan.
    /// Lives' Plans of `shard` this host tracks.
    pub(crate) fn tracked_lives(&self, shard: u32) -> usize {
        self.tracked
            .lock()
            .expect("tracked lock")
            .lives
            .get(&shard)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn tracks(&self, plan_id: &str, claim: &str) -> bool {
        self.tracked
            .lock()
            .expect("tracked lock")
            .plans
            .contains_key(&(plan_id.to_string(), claim.to_string()))
    }

    /// Counts a run that failed for good in the cluster's failures of the last hour
    /// (`Store::count_failure`), in the background: a lost count is only a statistic.
    pub(crate) fn count_failure(&self) {
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.count_failure().await {
                tracing::debug!(error = %e, "cannot count a failed run");
            }
        });
    }

    /// This host's lease was found expired: renew it now.
    pub(crate) fn lease_lost(&self) {
        self.renew_now.notify_one();
    }

    /// A shard's lease was renewed, at `renewed_at_ms` (taken before the renewal was
    /// sent), until `until_ms`.
    pub(crate) fn lease_renewed(&self, shard: u32, renewed_at_ms: i64, until_ms: i64) {
        if let Some(lease) = self.shards.lease(shard) {
            lease.renewed(renewed_at_ms, until_ms);
        }
        self.heard_from_redis(renewed_at_ms);
    }

    /// This host announced itself or renewed a lease at `at_ms`.
    pub(crate) fn heard_from_redis(&self, at_ms: i64) {
        self.last_renewed_ms.fetch_max(at_ms, Ordering::AcqRel);
    }

    /// The current lease on `shard`, for [`lease_intact`](Self::lease_intact); None when
    /// this host does not own the shard.
    pub(crate) fn lease_token(&self, shard: u32) -> Option<LeaseToken> {
        self.shards.lease(shard).map(LeaseToken::new)
    }

    /// Whether the lease a token was taken under still holds, with a quarter of the
    /// lease to spare: the heartbeat renews it every quarter, so a healthy host always
    /// has three quarters left, and the spare covers the time a request takes to go out
    /// after the question and another host's takeover, hand-back and claim.
    pub(crate) fn lease_intact(&self, token: &LeaseToken) -> bool {
        token.intact(wall_ms() + self.lease_ms() / 4)
    }

    /// How long this host's leases hold still, by its own clock (ms; negative: one has
    /// lapsed): the shortest of its shards', or a whole lease from its last renewal when
    /// it owns none.
    pub fn lease_left_ms(&self) -> i64 {
        let now = wall_ms();
        self.shards
            .all()
            .iter()
            .map(|(_, o)| o.lease.until_ms() - now)
            .min()
            .unwrap_or_else(|| self.last_renewed_ms.load(Ordering::Acquire) + self.lease_ms() - now)
    }

    /// How long ago the lease was last renewed (ms).
    pub fn ms_since_lease_renewed(&self) -> i64 {
        wall_ms() - self.last_renewed_ms.load(Ordering::Acquire)
    }

    /// Plans this host holds in memory (timer, queue, running).
    pub fn claimed(&self) -> usize {
        self.tracked.lock().expect("tracked lock").plans.len()
    }

    /// Queue tasks among them.
    fn tasks_claimed(&self) -> usize {
        self.tracked.lock().expect("tracked lock").tasks
    }

    /// Runs under way on this host.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Starts every task of the engine. The returned handle completes after a graceful
    /// shutdown: claiming stopped, runs finished (or the grace period passed), and every
    /// Plan still held handed back to Redis.
    pub fn start(self: &Arc<Self>, shutdown: ShutdownSignal) -> tokio::task::JoinHandle<()> {
        let rx = self
            .queue_rx
            .lock()
            .expect("queue lock")
            .take()
            .expect("engine started twice");
        // The leases are renewed until every Plan is handed back, so that no other host
        // takes over a run this one is still finishing.
        let (stopped_tx, stopped) = watch::channel(false);
        let keeper = tokio::spawn(self.clone().shard_keeper(shutdown.clone(), stopped));
        let tasks = vec![
            tokio::spawn(self.clone().claimer(shutdown.clone())),
            tokio::spawn(self.clone().dispatcher(shutdown.clone())),
            tokio::spawn(self.clone().listener(shutdown.clone())),
            tokio::spawn(self.clone().supervisor(shutdown.clone())),
            tokio::spawn(self.clone().memory_watch(shutdown.clone())),
        ];
        let pool = tokio::spawn(self.clone().worker_pool(rx, shutdown.clone()));
        let engine = self.clone();
        tokio::spawn(async move {
            let _ = pool.await;
            for task in tasks {
                let _ = task.await;
            }
            engine.hand_back_all().await;
            let _ = stopped_tx.send(true);
            let _ = keeper.await;
        })
    }

    async fn claimer(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let interval = self.config.booking_plan_watch_interval;
        let mut last_full = tokio::time::Instant::now() - interval;
        loop {
            // Every shard at each watch interval; in between, those whose channel spoke.
            let full = last_full.elapsed() >= interval;
            if full {
                last_full = tokio::time::Instant::now();
            }
            self.claim_pass(full).await;
            let pause = self
                .until_next_task()
                .min(interval.saturating_sub(last_full.elapsed()));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.claim_wakeup.notified() => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }

    /// How long the claimer may sleep: the watch interval, or less when a queue task
    /// comes within its look-ahead sooner (tasks are not claimed a whole window ahead, so
    /// nothing else would wake the claimer for them).
    fn until_next_task(&self) -> Duration {
        let interval = self.config.booking_plan_watch_interval;
        if self.starved.load(Ordering::Acquire) {
            return interval;
        }
        let now_ms = self.clock.now_ms();
        let next = self
            .next_task_ms
            .lock()
            .expect("next task lock")
            .values()
            .copied()
            .filter(|&ms| ms > now_ms + TASK_LOOKAHEAD_MS)
            .min();
        match next {
            Some(next_ms) => {
                let wait_ms = (next_ms - TASK_LOOKAHEAD_MS - now_ms).max(10) as u64;
                interval.min(Duration::from_millis(wait_ms))
            }
            None => interval,
        }
    }

    /// Claims from the shards this host owns (every one, or those whose channel spoke)
    /// until nothing more is due in the window or back-pressure says stop. Each shard's
    /// claim goes on its own task, and a pass does not wait for them: a master that does
    /// not answer delays the claims of its own shards only. A shard whose claim is still
    /// under way is looked at again when it ends.
    async fn claim_pass(self: &Arc<Self>, full: bool) {
        let dirty: BTreeSet<u32> = std::mem::take(&mut *self.dirty.lock().expect("dirty lock"));
        let shards: Vec<(u32, u64)> = self
            .shards
            .active()
            .into_iter()
            .filter(|(s, _)| full || dirty.contains(s))
            .collect();
        for (shard, gen) in shards {
            if !self.claiming.lock().expect("claiming lock").insert(shard) {
                // Under way: its claim looks again once it ends.
                self.dirty.lock().expect("dirty lock").insert(shard);
                continue;
            }
            let engine = self.clone();
            tokio::spawn(async move {
                let room_left = engine.claim_shard(shard, gen).await;
                engine
                    .claiming
                    .lock()
                    .expect("claiming lock")
                    .remove(&shard);
                if !room_left {
                    // Out of room: looked at again when room comes back.
                    engine.dirty.lock().expect("dirty lock").insert(shard);
                } else if engine.dirty.lock().expect("dirty lock").contains(&shard) {
                    engine.claim_wakeup.notify_one();
                }
            });
        }
    }

    /// The gate of one shard's claims (see `claim_gates`).
    pub(crate) fn claim_gate(&self, shard: u32) -> Arc<tokio::sync::Mutex<()>> {
        self.claim_gates
            .lock()
            .expect("claim gates lock")
            .entry(shard)
            .or_default()
            .clone()
    }

    /// Takes up to `want` of the room left in memory (`max_claimed`, less what is
    /// tracked and what claims under way have taken), atomically.
    fn reserve_room(&self, want: usize) -> usize {
        let mut reserved = self.reserved.load(Ordering::Acquire);
        loop {
            let room = self
                .config
                .max_claimed
                .saturating_sub(self.claimed() + reserved)
                .min(want);
            if room == 0 {
                return 0;
            }
            match self.reserved.compare_exchange(
                reserved,
                reserved + room,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return room,
                Err(now) => reserved = now,
            }
        }
    }

    /// Claims from one shard until it has nothing more due in the window; false when
    /// back-pressure stopped it.
    async fn claim_shard(&self, shard: u32, gen: u64) -> bool {
        loop {
            let limit = self.reserve_room(CLAIM_BATCH);
            if limit == 0 || self.queue_tx.capacity() == 0 {
                self.reserved.fetch_sub(limit, Ordering::AcqRel);
                self.starved.store(true, Ordering::Release);
                return false;
            }
            // Given back once the claimed Plans are tracked (or the claim failed); room it
            // took and did not fill wakes the shards that found none meanwhile.
            let reservation = Reservation {
                engine: self,
                room: limit,
            };
            // Queue tasks may take at most half of the room: a queue at its limits must
            // never keep births, deaths and timers out of memory.
            let task_limit = (self.config.max_claimed / 2).saturating_sub(self.tasks_claimed());
            let now_ms = self.clock.now_ms();
            let gate = self.claim_gate(shard);
            let gate = gate.lock().await;
            let reply = self
                .store
                .claim(
                    shard,
                    &self.host_id,
                    gen,
                    now_ms + self.window_ms(),
                    limit,
                    now_ms + TASK_LOOKAHEAD_MS,
                    task_limit,
                )
                .await;
            let (batch, next_task_ms) = match reply {
                Ok(ClaimReply::Claimed {
                    plans,
                    next_task_ms,
                }) => (plans, next_task_ms),
                Ok(ClaimReply::Lost) => {
                    drop(gate);
                    tracing::warn!(shard, "the shard is another host's now; dropping it");
                    self.drop_shard(shard);
                    return true;
                }
                Ok(ClaimReply::Expired) => {
                    drop(gate);
                    self.lease_lost();
                    return true;
                }
                Err(e) if e.is_connection_refusal() => {
                    // Not sent (its node is down or being replaced): nothing to hand back.
                    drop(gate);
                    self.store_failed();
                    tracing::debug!(shard, error = %e, "cannot claim; the shard's node does not answer");
                    return true;
                }
                Err(e) => {
                    drop(gate);
                    self.store_failed();
                    // The claim may have applied with its reply lost, leaving Plans
                    // Preset under this host that it does not know of: hand them back
                    // now rather than when the periodic audit comes round.
                    tracing::warn!(shard, error = %e, "claim failed; handing back what it may have claimed");
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), self.audit_shard(shard)).await;
                    return true;
                }
            };
            {
                let mut next = self.next_task_ms.lock().expect("next task lock");
                match next_task_ms {
                    Some(ms) => next.insert(shard, ms),
                    None => next.remove(&shard),
                };
            }
            let claimed = batch.len();
            for plan in &batch {
                self.track(plan);
            }
            drop(reservation);
            drop(gate);
            for plan in batch {
                let at = plan.fire_at_ms;
                self.schedule(plan, at);
            }
            if claimed < limit {
                return true;
            }
        }
    }

    async fn dispatcher(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        loop {
            let earliest = self
                .timer
                .lock()
                .expect("timer lock")
                .first_key_value()
                .map(|(k, _)| k.0);
            let now_ms = self.clock.now_ms();
            match earliest {
                Some(at) if at <= now_ms => {
                    let due = self.pop_due(now_ms);
                    for plan in due {
                        tokio::select! {
                            sent = self.queue_tx.send(plan) => if sent.is_err() { return },
                            _ = until_shutdown(&mut shutdown) => return,
                        }
                    }
                }
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis((at - now_ms) as u64)) => {}
                        _ = self.timer_wakeup.notified() => {}
                        _ = until_shutdown(&mut shutdown) => return,
                    }
                }
                None => {
                    tokio::select! {
                        _ = self.timer_wakeup.notified() => {}
                        _ = until_shutdown(&mut shutdown) => return,
                    }
                }
            }
        }
    }

    /// Takes the entries due by `now_ms` off the front of the timer (O(k log n) for k due
    /// entries; the rest of the map is left in place).
    fn pop_due(&self, now_ms: i64) -> Vec<Claimed> {
        let mut timer = self.timer.lock().expect("timer lock");
        let mut due = Vec::new();
        while let Some(entry) = timer.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            due.push(*entry.remove());
        }
        due
    }

    /// Takes fired Plans from the queue, as many at once as there are free worker slots
    /// (up to `START_BATCH`), and starts them with one Redis call per batch. Runs that
    /// wait for a worker go by priority (a timer's 1..4; other Plans rank 2), then by
    /// fire time: whatever is in the queue is pulled into a heap before each pick.
    async fn worker_pool(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Claimed>,
        mut shutdown: ShutdownSignal,
    ) {
        let slots = Arc::new(Semaphore::new(self.config.workers));
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let finisher = tokio::spawn(self.clone().finisher(finished_rx));
        let mut waiting = WaitingRuns::default();
        let room = self.config.timedout_queue_max_size.max(START_BATCH);
        // Runs given a worker slot, waiting for their lane's start call: one call per
        // lane at a time, on a task of its own, and what comes meanwhile goes into its
        // next call. On a Redis Cluster a lane is a shard, so that a shard whose master
        // does not answer holds up no other shard's starts; on a standalone Redis one
        // lane takes every shard's (`lane_of`).
        let mut lanes: HashMap<u32, Vec<(Claimed, tokio::sync::OwnedSemaphorePermit)>> =
            HashMap::new();
        let mut in_flight: BTreeSet<u32> = BTreeSet::new();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<u32>();
        loop {
            tokio::select! {
                biased;
                _ = until_shutdown(&mut shutdown) => break,
                Some(lane) = done_rx.recv() => {
                    in_flight.remove(&lane);
                }
                plan = rx.recv(), if waiting.len() < room => match plan {
                    Some(plan) => {
                        waiting.push(plan);
                        while waiting.len() < room {
                            match rx.try_recv() {
                                Ok(plan) => waiting.push(plan),
                                Err(_) => break,
                            }
                        }
                        self.room_freed();
                    }
                    None => break,
                },
                slot = slots.clone().acquire_owned(), if !waiting.is_empty() => {
                    let slot = slot.expect("semaphore never closes");
                    let first = waiting.pop().expect("not empty");
                    lanes
                        .entry(self.lane_of(first.shard))
                        .or_default()
                        .push((first, slot));
                    while !waiting.is_empty() {
                        let Ok(slot) = slots.clone().try_acquire_owned() else {
                            break;
                        };
                        let plan = waiting.pop().expect("not empty");
                        lanes
                            .entry(self.lane_of(plan.shard))
                            .or_default()
                            .push((plan, slot));
                    }
                }
            }
            // Every idle lane with runs given a slot gets its start call now.
            let ready: Vec<u32> = lanes
                .iter()
                .filter(|(lane, runs)| !runs.is_empty() && !in_flight.contains(*lane))
                .map(|(lane, _)| *lane)
                .collect();
            for lane in ready {
                let runs = lanes.get_mut(&lane).expect("listed");
                let batch: Vec<_> = runs.drain(..runs.len().min(START_BATCH)).collect();
                in_flight.insert(lane);
                let engine = self.clone();
                let finished = finished_tx.clone();
                let done = done_tx.clone();
                self.starting.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(async move {
                    engine.start_batch(batch, &finished).await;
                    engine.starting.fetch_sub(1, Ordering::AcqRel);
                    let _ = done.send(lane);
                });
            }
        }
        // Graceful stop: let runs under way finish and be recorded (the lease is still
        // renewed, so nobody takes them over meanwhile), for at most shutdown_timeout;
        // what is still running then is handed back with the rest.
        let deadline = tokio::time::Instant::now() + self.config.shutdown_timeout;
        while self.running.load(Ordering::Acquire) + self.starting.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(finished_tx);
        if self.running.load(Ordering::Acquire) == 0 {
            let _ = finisher.await;
        }
        // What is still queued stays Preset under this host's lease; hand_back_all returns it.
        rx.close();
    }

    /// Gives every shard up, with the Plans held in it (graceful shutdown, or at once on
    /// a second signal, runs under way included: they run again elsewhere), and leaves
    /// the live hosts, so that the others take the shards at once.
    pub(crate) async fn hand_back_all(&self) {
        self.timer.lock().expect("timer lock").clear();
        let mut moved = 0;
        for (shard, owned) in self.shards.all() {
            if let Some(n) = self.give_up_shard(shard, owned.gen).await {
                moved += n;
                self.shards.remove(shard);
            } else {
                tracing::error!(
                    shard,
                    "cannot give the shard up; another host takes it when its lease runs out"
                );
            }
        }
        if moved > 0 {
            tracing::info!(moved, "handed claimed Plans back");
        }
        if let Err(e) = self.store.retire_host(&self.host_id).await {
            tracing::warn!(error = %e, "cannot leave the list of live hosts; the others notice when this host's lease runs out");
        }
    }

    /// Listens on every shard's notify channel (one pattern subscription); a Plan due
    /// within the window in a shard this host works wakes the claimer for that shard.
    /// On a cluster, PUBLISH reaches every node, so any one node will do: each attempt
    /// takes the next.
    /// Listens to every shard's notify channel. On a cluster (where PUBLISH reaches every
    /// node) it listens on two nodes at once when it knows two, so that the node of one
    /// subscription dying loses no notification while it subscribes again elsewhere.
    async fn listener(self: Arc<Self>, shutdown: ShutdownSignal) {
        let nodes = self.store.target().nodes();
        let listeners = (0..nodes.len().min(2)).map(|first| {
            let engine = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { engine.listen_from(first, shutdown).await })
        });
        futures_util::future::join_all(listeners.collect::<Vec<_>>()).await;
    }

    /// One subscription, moving to the next node each time it is lost, starting at the
    /// node `first` of those named in the Redis URL.
    async fn listen_from(self: Arc<Self>, first: usize, mut shutdown: ShutdownSignal) {
        let pattern = self.store.notify_pattern();
        let nodes = self.store.target().nodes();
        let mut attempt = first;
        loop {
            let node = &nodes[attempt % nodes.len()];
            attempt += 1;
            let client = match redis::Client::open(node.as_str()) {
                Ok(client) => client,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a pub/sub client");
                    return;
                }
            };
            match client.get_async_pubsub().await {
                Ok(mut pubsub) => match pubsub.psubscribe(&pattern).await {
                    Ok(()) => {
                        // Anything published while we were not listening is found by a
                        // full pass.
                        for (shard, _) in self.shards.active() {
                            self.mark_dirty(shard);
                        }
                        let mut messages = pubsub.on_message();
                        loop {
                            tokio::select! {
                                message = messages.next() => match message {
                                    Some(m) => {
                                        let fire_ms: i64 = m.get_payload().unwrap_or(0);
                                        if fire_ms > self.notify_before_ms() {
                                            continue;
                                        }
                                        if let Some(shard) = self.store.shard_of_channel(m.get_channel_name()) {
                                            if self.shards.active_gen(shard).is_some() {
                                                self.mark_dirty(shard);
                                            }
                                        }
                                    }
                                    None => break,
                                },
                                _ = until_shutdown(&mut shutdown) => return,
                            }
                        }
                        tracing::warn!("notify subscription lost; reconnecting");
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot subscribe to the notify channels"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, node = %node, "cannot open a pub/sub connection")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }
}

/// Room in memory taken by a claim under way, given back when dropped: the claim's
/// Plans are tracked by then, and any room left wakes the shards that found none while
/// this claim held it (they wait in `dirty`).
struct Reservation<'a> {
    engine: &'a Engine,
    room: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.engine.reserved.fetch_sub(self.room, Ordering::AcqRel);
        self.engine.room_freed();
    }
}
