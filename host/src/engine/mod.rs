//! The firing engine of one host: the state its three roles share. `scheduler.rs`
//! claims due Plans into the timer, `executor.rs` runs them and records their outcomes,
//! `supervisor.rs` keeps the shards' leases and their upkeep; each adds its methods to
//! [`Engine`] and names only this module, not the others.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch, Notify};

use crate::actions::webhook::WebhookAgent;
use crate::clock::Clock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbound::OutboundPolicy;
use crate::plugins::PluginRuntime;
use crate::store::{Claimed, Store};

mod leases;
mod tracked;

pub(crate) use leases::{LeaseToken, ShardTable};
pub(crate) use tracked::{Tracked, WaitingRuns};

/// Most Plans one `start_run` call fences.
pub(crate) const START_BATCH: usize = 256;

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
    pub(crate) claim_wakeup: Notify,
    /// The shards this host works.
    pub(crate) shards: ShardTable,
    /// Shards whose notify channel spoke since their last claim.
    pub(crate) dirty: Mutex<BTreeSet<u32>>,
    /// When each owned shard's first queue task left in `due_tasks` is due.
    pub(crate) next_task_ms: Mutex<HashMap<u32, i64>>,
    /// Boxed so that the B-tree shifts 8-byte pointers, not whole Plans, as entries come and go.
    pub(crate) timer: Mutex<BTreeMap<(i64, u64), Box<Claimed>>>,
    pub(crate) timer_wakeup: Notify,
    pub(crate) sequence: AtomicU64,
    /// Plans this host holds in memory (in the timer, in the queue or running), by
    /// (Plan, claim). The self-audit hands back the Plans this host holds in Redis that
    /// are not here.
    pub(crate) tracked: Mutex<Tracked>,
    /// Per shard: held by a claim from its call until its Plans are tracked, and by the
    /// audit while it compares Redis with `tracked`, so that the audit never mistakes a
    /// Plan being claimed for one this host lost track of. One per shard, so that a
    /// claim that waits on a master that does not answer holds up no other shard.
    pub(crate) claim_gates: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
    /// Shards with a claim under way: a claim pass starts one per shard at most, and
    /// does not wait for it, so a shard whose master does not answer holds up no other.
    pub(crate) claiming: Mutex<BTreeSet<u32>>,
    /// Runs under way now, from a successful start until their outcome is recorded.
    pub(crate) running: AtomicUsize,
    /// Start batches sent and not yet answered (each on a task of its own).
    pub(crate) starting: AtomicUsize,
    /// Room in memory taken by claims under way (their Plans not yet tracked): claims of
    /// several shards go at once, and together must stay within `max_claimed`.
    pub(crate) reserved: AtomicUsize,
    /// Asks the shard keeper to renew the leases now (a claim or start found one
    /// expired).
    pub(crate) renew_now: Notify,
    /// When this host last failed to reach Redis (ms): after an outage every shard's
    /// lease may look expired, so the shard keeper leaves other hosts' shards alone for
    /// a lease period while they renew.
    pub(crate) last_store_error_ms: std::sync::atomic::AtomicI64,
    /// When this host last announced itself or renewed a shard's lease (ms). Each
    /// shard's own lease is watched in its entry of `shards` (`LeaseWatch`).
    pub(crate) last_renewed_ms: std::sync::atomic::AtomicI64,
    /// Set when a claim pass stopped because of back-pressure; the next finished run
    /// wakes the claimer.
    pub(crate) starved: AtomicBool,
    pub(crate) queue_tx: mpsc::Sender<Claimed>,
    pub(crate) queue_rx: Mutex<Option<mpsc::Receiver<Claimed>>>,
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
        let policy = Arc::new(OutboundPolicy::new(
            config.allowed_hosts.clone(),
            config.gateway_url.as_deref(),
        ));
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
            shards: ShardTable::default(),
            dirty: Mutex::new(BTreeSet::new()),
            next_task_ms: Mutex::new(HashMap::new()),
            timer: Mutex::new(BTreeMap::new()),
            timer_wakeup: Notify::new(),
            sequence: AtomicU64::new(0),
            tracked: Mutex::new(Tracked::default()),
            claim_gates: Mutex::new(HashMap::new()),
            claiming: Mutex::new(BTreeSet::new()),
            running: AtomicUsize::new(0),
            starting: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            renew_now: Notify::new(),
            last_store_error_ms: std::sync::atomic::AtomicI64::new(i64::MIN),
            last_renewed_ms: std::sync::atomic::AtomicI64::new(wall_ms()),
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
}

/// The machine's clock: leases, heartbeats and outages are timed by it, never by the
/// engine's clock (which `--clock manual` moves ahead).
pub(crate) fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
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
