//! The Scheduler role: claims Plans due within the look-ahead window
//! (`preset_execution_time`) from Redis into an in-memory timer, and hands each one to the
//! worker pool at its fire time.
//!
//! - **Claimer**: runs the `claim` script at least every `booking_plan_watch_interval`, and
//!   at once when the `notify` channel says a Plan became due inside the window (a new
//!   booking, a retry, a Plan taken back from a dead host). It claims nothing while the
//!   queue of fired Plans is full or `max_claimed` Plans are already in memory, so
//!   pressure stops claiming instead of dropping work.
//! - **Timer**: a `BTreeMap` ordered by (fire time, sequence) and a dispatcher task that
//!   sleeps until the earliest entry, woken early through a `Notify` when an earlier
//!   entry arrives.
//! - **Queue**: a bounded channel of `timedout_queue_max_size` fired Plans; a pool of
//!   `workers` concurrent runs drains it (`executor.rs`).
//!
//! **Architecture invariant:** a claimed Plan stays under this host's lease (Preset in
//! Redis, member of `held:{host}`) until `finish_run` or a hand-back releases it, so a
//! crash at any point leaves it to the supervisor of another host.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::actions::webhook::WebhookAgent;
use crate::clock::Clock;
use crate::config::Config;
use crate::executor::START_BATCH;
use crate::metrics::Metrics;
use crate::outbound::OutboundPolicy;
use crate::plugins::PluginRuntime;
use crate::store::{Claimed, Store};

/// Most Plans one `claim` call moves.
const CLAIM_BATCH: usize = 1000;
/// How far ahead queue tasks are claimed: they may still have to wait for their queue's
/// tokens, and a backlog waits in Redis (`due_tasks`), not in a host's memory.
const TASK_LOOKAHEAD_MS: i64 = 1000;

/// The firing engine of one host: scheduler, workers and supervisor share it.
pub struct Engine {
    pub store: Store,
    pub config: Config,
    pub clock: Arc<dyn Clock>,
    pub host_id: String,
    pub(crate) webhook: WebhookAgent,
    /// Runs plugin actions.
    pub plugins: Arc<PluginRuntime>,
    /// Counters shared with the API's `/metrics`.
    pub metrics: Arc<Metrics>,
    claim_wakeup: Notify,
    /// Boxed so that the B-tree shifts 8-byte pointers, not whole Plans, as entries come and go.
    timer: Mutex<BTreeMap<(i64, u64), Box<Claimed>>>,
    timer_wakeup: Notify,
    sequence: AtomicU64,
    /// Plans this host holds in memory: in the timer, in the queue or running.
    pub(crate) in_memory: AtomicUsize,
    /// Runs under way now, from a successful start until their outcome is recorded.
    pub(crate) running: AtomicUsize,
    /// Ids of those runs: the self-audit must never hand back a Plan that is running.
    pub(crate) in_flight: Mutex<HashSet<String>>,
    /// Set when a claim pass stopped because of back-pressure; the next finished run
    /// wakes the claimer.
    starved: AtomicBool,
    queue_tx: mpsc::Sender<Claimed>,
    queue_rx: Mutex<Option<mpsc::Receiver<Claimed>>>,
}

/// Fired Plans waiting for a worker, best first: priority rank (1 first), then fire time,
/// then arrival.
#[derive(Default)]
pub(crate) struct WaitingRuns {
    heap: BinaryHeap<(Reverse<WaitKey>, WaitingRun)>,
    arrivals: u64,
}

/// (priority rank, fire time ms, arrival number).
type WaitKey = (u8, i64, u64);

/// A Plan in `WaitingRuns`; the key alone orders the heap.
struct WaitingRun(Claimed);

impl PartialEq for WaitingRun {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for WaitingRun {}
impl PartialOrd for WaitingRun {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for WaitingRun {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl WaitingRuns {
    pub(crate) fn push(&mut self, plan: Claimed) {
        self.arrivals += 1;
        let key = (plan.opts.rank(), plan.fire_at_ms, self.arrivals);
        self.heap.push((Reverse(key), WaitingRun(plan)));
    }
    pub(crate) fn pop(&mut self) -> Option<Claimed> {
        self.heap.pop().map(|(_, run)| run.0)
    }
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// A watch channel that turns true once, when the host begins to shut down.
pub type ShutdownSignal = watch::Receiver<bool>;

pub(crate) async fn until_shutdown(shutdown: &mut ShutdownSignal) {
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

impl Engine {
    pub fn new(
        store: Store,
        config: Config,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        tls: rustls::ClientConfig,
        plugins: Arc<PluginRuntime>,
    ) -> Arc<Engine> {
        let (queue_tx, queue_rx) = mpsc::channel(config.timedout_queue_max_size);
        let policy =
            OutboundPolicy::new(config.allowed_hosts.clone(), config.gateway_url.as_deref());
        let webhook = WebhookAgent::new(
            config.gateway_url.clone(),
            policy,
            config.signing_key.clone(),
            config.connect_timeout,
            config.request_timeout,
            config.response_body_limit,
            tls,
        );
        Arc::new(Engine {
            host_id: config.host_id.clone(),
            store,
            config,
            clock,
            webhook,
            plugins,
            metrics,
            claim_wakeup: Notify::new(),
            timer: Mutex::new(BTreeMap::new()),
            timer_wakeup: Notify::new(),
            sequence: AtomicU64::new(0),
            in_memory: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            in_flight: Mutex::new(HashSet::new()),
            starved: AtomicBool::new(false),
            queue_tx,
            queue_rx: Mutex::new(Some(queue_rx)),
        })
    }

    pub(crate) fn window_ms(&self) -> i64 {
        self.config.preset_execution_time.as_millis() as i64
    }

    pub(crate) fn lease_ms(&self) -> i64 {
        self.config.lease_ttl.as_millis() as i64
    }

    /// Bookings due before this are announced on the notify channel.
    pub(crate) fn notify_before_ms(&self) -> i64 {
        self.clock.now_ms() + self.window_ms()
    }

    /// Asks the claimer for a pass now.
    pub fn wake_claimer(&self) {
        self.claim_wakeup.notify_one();
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

    /// A Plan left this host's memory (finished, lost or handed back).
    pub(crate) fn forget(&self) {
        self.in_memory.fetch_sub(1, Ordering::AcqRel);
        if self.starved.swap(false, Ordering::AcqRel) {
            self.claim_wakeup.notify_one();
        }
    }

    /// Plans this host holds in memory (timer, queue, running).
    pub fn claimed(&self) -> usize {
        self.in_memory.load(Ordering::Acquire)
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
        let tasks = vec![
            tokio::spawn(self.clone().claimer(shutdown.clone())),
            tokio::spawn(self.clone().dispatcher(shutdown.clone())),
            tokio::spawn(self.clone().listener(shutdown.clone())),
            tokio::spawn(self.clone().heartbeat(shutdown.clone())),
            tokio::spawn(self.clone().supervisor(shutdown.clone())),
        ];
        let pool = tokio::spawn(self.clone().worker_pool(rx, shutdown.clone()));
        let engine = self.clone();
        tokio::spawn(async move {
            let _ = pool.await;
            for task in tasks {
                let _ = task.await;
            }
            engine.hand_back_all().await;
        })
    }

    async fn claimer(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        loop {
            self.claim_pass().await;
            let pause = self.until_next_task().await;
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
    async fn until_next_task(&self) -> Duration {
        let interval = self.config.booking_plan_watch_interval;
        if self.starved.load(Ordering::Acquire) {
            return interval;
        }
        let now_ms = self.clock.now_ms();
        match self
            .store
            .next_task_due_ms(now_ms + TASK_LOOKAHEAD_MS)
            .await
        {
            Ok(Some(next_ms)) => {
                let wait_ms = (next_ms - TASK_LOOKAHEAD_MS - now_ms).max(10) as u64;
                interval.min(Duration::from_millis(wait_ms))
            }
            _ => interval,
        }
    }

    /// Claims until nothing more is due in the window or back-pressure says stop.
    async fn claim_pass(&self) {
        loop {
            let room = self
                .config
                .max_claimed
                .saturating_sub(self.in_memory.load(Ordering::Acquire));
            if room == 0 || self.queue_tx.capacity() == 0 {
                self.starved.store(true, Ordering::Release);
                return;
            }
            let limit = room.min(CLAIM_BATCH);
            let now_ms = self.clock.now_ms();
            let batch = match self
                .store
                .claim(
                    &self.host_id,
                    now_ms + self.window_ms(),
                    limit,
                    now_ms + self.lease_ms(),
                    now_ms + TASK_LOOKAHEAD_MS,
                )
                .await
            {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed; retrying at the next scan");
                    return;
                }
            };
            let claimed = batch.len();
            self.in_memory.fetch_add(claimed, Ordering::AcqRel);
            for plan in batch {
                let at = plan.fire_at_ms;
                self.schedule(plan, at);
            }
            if claimed < limit {
                return;
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
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => s.expect("semaphore never closes"),
                _ = until_shutdown(&mut shutdown) => break,
            };
            if waiting.is_empty() {
                let first = tokio::select! {
                    plan = rx.recv() => match plan { Some(p) => p, None => break },
                    _ = until_shutdown(&mut shutdown) => break,
                };
                waiting.push(first);
            }
            while waiting.len() < room {
                match rx.try_recv() {
                    Ok(plan) => waiting.push(plan),
                    Err(_) => break,
                }
            }
            let first = waiting.pop().expect("at least one run waits");
            let mut batch = vec![(first, slot)];
            while batch.len() < START_BATCH && !waiting.is_empty() {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    break;
                };
                batch.push((waiting.pop().expect("not empty"), slot));
            }
            self.start_batch(batch, &finished_tx).await;
        }
        // Graceful stop: let runs under way finish and be recorded, within the lease so
        // that nobody else has taken them over meanwhile.
        let deadline = tokio::time::Instant::now() + self.config.lease_ttl;
        while self.running.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(finished_tx);
        if self.running.load(Ordering::Acquire) == 0 {
            let _ = finisher.await;
        }
        // What is still queued stays Preset under this host's lease; hand_back_all returns it.
        rx.close();
    }

    /// Gives every Plan this host holds back to the due set (graceful shutdown).
    async fn hand_back_all(&self) {
        let notify_before = self.notify_before_ms();
        for _ in 0..10_000 {
            match self
                .store
                .reclaim(&self.host_id, CLAIM_BATCH, None, notify_before)
                .await
            {
                Ok((moved, left)) => {
                    if moved > 0 {
                        tracing::info!(moved, "handed claimed Plans back");
                    }
                    if left <= 0 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot hand Plans back; another host will reclaim them when this lease expires");
                    break;
                }
            }
        }
        self.timer.lock().expect("timer lock").clear();
    }

    /// Listens on the notify channel; any Plan due within the window wakes the claimer.
    async fn listener(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let channel = self.store.keys.notify();
        loop {
            match self.store.client().get_async_pubsub().await {
                Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                    Ok(()) => {
                        // Anything published while we were not listening is found by a pass.
                        self.wake_claimer();
                        let mut messages = pubsub.on_message();
                        loop {
                            tokio::select! {
                                message = messages.next() => match message {
                                    Some(m) => {
                                        let fire_ms: i64 = m.get_payload().unwrap_or(0);
                                        if fire_ms <= self.notify_before_ms() {
                                            self.wake_claimer();
                                        }
                                    }
                                    None => break,
                                },
                                _ = until_shutdown(&mut shutdown) => return,
                            }
                        }
                        tracing::warn!("notify subscription lost; reconnecting");
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot subscribe to the notify channel"),
                },
                Err(e) => tracing::warn!(error = %e, "cannot open a pub/sub connection"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunOpts;

    fn plan(id: &str, fire_at_ms: i64, priority: Option<u8>) -> Claimed {
        Claimed {
            plan_id: id.into(),
            fire_at_ms,
            claim: "1".into(),
            action: String::new(),
            attempts: 0,
            resource_id: None,
            opts: RunOpts {
                priority,
                ..RunOpts::default()
            },
        }
    }

    #[test]
    fn waiting_runs_go_by_priority_then_fire_time_then_arrival() {
        let mut w = WaitingRuns::default();
        w.push(plan("low:timer", 100, Some(4)));
        w.push(plan("life-late:birth", 300, None));
        w.push(plan("high:timer", 500, Some(1)));
        w.push(plan("life-early:birth", 200, None));
        w.push(plan("same-time-second:birth", 200, None));
        let order: Vec<String> = std::iter::from_fn(|| w.pop()).map(|p| p.plan_id).collect();
        assert_eq!(
            order,
            [
                "high:timer",
                "life-early:birth",
                "same-time-second:birth",
                "life-late:birth",
                "low:timer"
            ]
        );
        assert!(w.is_empty());
    }
}
