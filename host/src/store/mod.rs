//! All Redis access: the key layout (documented in `docs/redis-layout.md`) and the Lua
//! scripts in `scripts/` through which every multi-key change goes.
//!
//! **Architecture invariant:** a Plan changes state only inside one of the scripts of
//! this module, each atomic in Redis, so a crash of a host between two steps leaves every
//! booking whole or absent, never half-written.
//!
//! The keyspace is split into `S` logical shards (`shards.rs`): every key of shard `i`
//! is under `{prefix}:{tag_i}:`, one Redis Cluster slot, and every script touches one
//! shard. Keys of one shard:
//! - `life:{uuid}` (hash): a Life, with its Plans' fields (`b.state`, `d.fire_at_ms`, ...;
//!   `ShardKeys::plan_field`), so that a Life is one key.
//! - `due` (sorted set, score = fire time in epoch ms): Plans waiting to be claimed.
//! - `lives` (sorted set, all scores 0, member `{birth_ms:013}:{uuid}`): the shard's
//!   Lives by birth time; listing merges the shards' indexes.
//! - `resource:{id}` (sorted set, score = birth ms): Lives of one resource.
//! - `order:{resource}` (sorted set, score = due time): the resource's unfinished Plans;
//!   only the first may start, so a resource's Plans run one at a time and in order.
//! - `owner` (hash: host, gen, until): the host that works the shard, under a lease whose
//!   generation fences claims and starts. `held` (sorted set, score = fire time): the
//!   Plans the owner has claimed. `claim_seq` (string): where claim numbers come from.
//! - `ptr:{uuid}` (string `{shard}:{ms}`): where a Life whose id belongs here lives when
//!   its resource put it in another shard.
//! - `runs` (stream, capped): every run of the shard's Lives; each run is also a field
//!   `run:{plan}:{attempt}` (JSON) of its Life hash, which is the Life's history.
//!   `finished` (sorted set, score = finish time): Lives to sweep after retention.
//!   `notify` (pub/sub channel): a Plan became due within the look-ahead window.
//! - Timers (`timers.rs`) and queues (`queues.rs`) add their own keys.
//!
//! Outside the shards: `meta` (hash: layout, shards), `hosts` (sorted set, score = until
//! when each live host is known alive), and the plugin registry under `{plugins}`.

mod conn;
mod idempotency;
mod lives;
mod memory;
pub mod migrate;
mod ownership;
mod queues;
mod replicas;
pub mod runs;
pub mod shards;
mod slot_router;
mod timers;

pub use conn::{Conn, Target, CLUSTER_SCHEME};
pub use idempotency::IdemBegin;
pub use lives::{booked_view, CancelOutcome, IdemBooked, ListFilter};
pub use memory::{Durability, MemoryState, RedisMemory, REFUSE_AT, SHED_AT};
pub use ownership::{preferred_host, ShardOwner, Takeover};
pub use queues::{LeasedTask, NewTask, NewTaskWork, QueueCounts, TaskAddRefusal};
pub use shards::{Placement, ShardKeys};
pub use timers::{NextRun, TimerFinish, TimerPut, TimerSlot, TIMER_RUNS_KEPT};

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{SecondsFormat, TimeZone};
use chrono_tz::Tz;
use redis::{AsyncCommands, Script};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::model::{PlanKind, RunOpts};

/// The layout this code reads and writes (`meta.layout`): 1 had no shards, 2 a hash per
/// Plan, 3 a Life's Plans folded into its hash.
pub const LAYOUT: u32 = 3;
/// Shards of a keyspace created without `--shards`.
pub const DEFAULT_SHARDS: u32 = 32;
/// Most shards a keyspace may have.
pub const MAX_SHARDS: u32 = 1024;

/// Names of the keys outside the shards.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The configured prefix followed by `:`.
    pub prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: format!("{prefix}:"),
        }
    }
    /// What the keyspace is: `layout`, `shards`, `created_at`.
    pub fn meta(&self) -> String {
        format!("{}meta", self.prefix)
    }
    /// Live hosts, scored by until when each is known alive (ms).
    pub fn hosts(&self) -> String {
        format!("{}hosts", self.prefix)
    }
    /// Runs that failed for good, per minute of the machine's clock (field: epoch
    /// minute), all hosts together: the overview's failures in the last hour.
    pub fn failures(&self) -> String {
        format!("{}failures", self.prefix)
    }
    /// Prefix of the plugin registry's keys, all in one slot.
    pub fn registry(&self) -> String {
        format!("{}{{plugins}}:", self.prefix)
    }
    /// Follow-up bookings of a plugin in one second.
    pub fn plugin_bookings(&self, plugin: &str, second: i64) -> String {
        format!("{}plugin-bookings:{plugin}:{second}", self.prefix)
    }
    /// Keys that only a keyspace written before shards has.
    pub fn legacy(&self) -> Vec<String> {
        [
            "due",
            "lives",
            "due_tasks",
            "timers",
            "queues",
            "finished",
            "plugins",
        ]
        .iter()
        .map(|k| format!("{}{k}", self.prefix))
        .collect()
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("{0}")]
    Layout(String),
}

/// The member of `lives` for a Life (see the module docs).
pub fn lives_member(birth_ms: i64, uuid: &str) -> String {
    format!("{birth_ms:013}:{uuid}")
}

/// Formats epoch ms as RFC 3339 in `tz` (`Z` for UTC, milliseconds only when non-zero).
pub fn rfc3339(ms: i64, tz: Tz) -> String {
    match tz.timestamp_millis_opt(ms).single() {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        None => String::new(),
    }
}

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {
        /// Every script, each with `common.lua` prepended.
        pub(crate) struct Scripts {
            $(pub(crate) $name: Script,)*
        }

        impl Scripts {
            fn load() -> Self {
                Scripts {
                    $($name: script(include_str!(concat!("scripts/", stringify!($name), ".lua"))),)*
                }
            }
        }
    };
}

scripts!(
    book,
    debounce,
    patch,
    cancel,
    pointer,
    claim,
    start_run,
    finish_run,
    release,
    sweep,
    timer_put,
    timer_run,
    timer_delete,
    finish_timer,
    timer_dialect,
    queue_put,
    queue_purge,
    queue_resume,
    task_add,
    task_change,
    task_lease,
    task_lease_change,
    finish_task,
    queue_wake,
    shard_takeover,
    shard_renew,
    shard_release,
    plugin_users,
    meta_init,
    migrate,
    idem_begin,
    idem_finish,
    book_idem,
    history_size,
    census_rebuild,
);

/// A script's text with `common.lua` prepended; a first line `#!lua flags=...` (Redis 7)
/// stays first.
fn script(body: &str) -> Script {
    Script::new(&script_text(body))
}

fn script_text(body: &str) -> String {
    let common = include_str!("scripts/common.lua");
    match body.strip_prefix("#!lua") {
        Some(rest) => {
            let (flags, rest) = rest.split_once('\n').unwrap_or((rest, ""));
            format!("#!lua{flags}\n{common}\n{rest}")
        }
        None => format!("{common}\n{body}"),
    }
}

/// A Plan claimed into a host's memory, with what is needed to fire it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub plan_id: String,
    /// The shard the Plan is in.
    pub shard: u32,
    pub fire_at_ms: i64,
    /// Fencing token: the Plan's claim counter when this host claimed it.
    pub claim: String,
    pub action: String,
    pub attempts: u32,
    pub resource_id: Option<String>,
    /// A timer's priority, retries and timeout (default for Lives and tasks).
    pub opts: RunOpts,
}

/// Whose Plan a claimed Plan is, from its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// `{uuid}:{birth|death}`.
    Life(&'a str, PlanKind),
    /// `{name}:timer`.
    Timer(&'a str),
    /// `{queue}/{task}:task`.
    Task { queue: &'a str, task: &'a str },
}

impl Claimed {
    /// The Life and kind encoded in the plan id `{uuid}:{kind}`.
    pub fn life_and_kind(&self) -> Option<(&str, PlanKind)> {
        let (uuid, kind) = self.plan_id.rsplit_once(':')?;
        Some((uuid, kind.parse().ok()?))
    }

    /// Whose Plan this is.
    pub fn owner(&self) -> Option<Owner<'_>> {
        let (head, kind) = self.plan_id.rsplit_once(':')?;
        match kind {
            "timer" => Some(Owner::Timer(head)),
            "task" => {
                let (queue, task) = head.split_once('/')?;
                Some(Owner::Task { queue, task })
            }
            other => Some(Owner::Life(head, other.parse().ok()?)),
        }
    }
}

/// What `start_run` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// Run it; this is execution number `attempts`.
    Run { attempts: u32 },
    /// This host no longer holds the Plan: drop it.
    Lost,
    /// An earlier Plan of the same resource is unfinished: try again shortly.
    Busy,
    /// A birth missed by more than birth_delay_limit_time; recorded, nothing to run.
    Invalidated,
    /// A queue task its queue does not admit yet (paused, full, or out of tokens): it
    /// waits in Redis (the queue's waiting set, or `due_tasks`); drop it.
    Deferred,
    /// A queue task whose first attempt missed its `expire_after`: recorded as Expired in
    /// its queue's failed list, nothing to run.
    Dropped,
    /// This host's lease ran out: renew it, then try again (the Plan may have been taken
    /// over meanwhile, which the next try finds out).
    Expired,
}

/// How a run ended, as `finish_run` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Done,
    Retry { next_ms: i64 },
    Failed,
}

/// One run as written to the Life's history stream (the host is the batch's).
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub should_run_at_ms: i64,
    pub started_at_ms: i64,
    pub duration_ms: u64,
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub attempt: u32,
    /// What a plugin returned.
    pub output: Option<Value>,
    /// A plugin's log lines.
    pub logs: Vec<String>,
    /// The target's `Retry-After`, in ms, when it set the next attempt's time.
    pub retry_after_ms: Option<u64>,
}

/// A run whose outcome is to be recorded.
#[derive(Debug, Clone)]
pub struct FinishedRun {
    pub plan: Claimed,
    pub outcome: RunOutcome,
    pub record: RunRecord,
    /// The callback to book with the outcome, when the run finished its Plan for good
    /// and its action has one for that outcome.
    pub callback: Option<Callback>,
}

/// A callback Life booked by a finish script (`book_callback` in `common.lua`).
#[derive(Debug, Clone, PartialEq)]
pub struct Callback {
    /// A fresh id whose home is the shard of the finished Plan.
    pub life_uuid: String,
    /// The callback action, the outcome in its body or input.
    pub action_json: String,
}

impl Callback {
    /// The two script arguments of a run's callback: its id and action, or two ''.
    pub(crate) fn args(callback: &Option<Callback>) -> (&str, &str) {
        match callback {
            Some(c) => (c.life_uuid.as_str(), c.action_json.as_str()),
            None => ("", ""),
        }
    }
}

/// The Redis-backed store. Cheap to clone: it shares one multiplexed, self-reconnecting
/// connection (or one cluster connection).
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    target: Target,
    pub keys: Keys,
    placement: Placement,
    shards: Arc<Vec<ShardKeys>>,
    pub(crate) scripts: Arc<Scripts>,
    timezone: Tz,
    /// Approximate cap of each shard's `runs` stream.
    runs_max_len: usize,
    /// Replicas that must hold a booking before it is answered (0: none asked).
    min_replicas_ack: u32,
    /// How full each shard's Redis was at the last look.
    memory: Arc<MemoryState>,
    /// Changes waiting for their replicas (store/replicas.rs).
    acks: Arc<replicas::ReplicaAcks>,
}

/// Members of a shard's `plugin-lives:{name}` set (SSCAN's COUNT), or timers, one
/// `plugin_users` call reads: a few hundred microseconds of Redis at a time.
pub const PLUGIN_USERS_PAGE: usize = 1_000;
/// The most pages `plugin_users` reads of a shard's Lives, or of its timers: ten million.
const MAX_PLUGIN_USERS_PAGES: usize = 10_000;

/// A Life's id as a number, to count each once in 16 bytes: a uuid as written by kairos
/// (lowercase, with dashes) is its own number; any other id a client chose (up to 64
/// letters, digits, `-`, `_`) is the first 16 bytes of its SHA-256, so that two ids that
/// differ only in case or dashes stay two.
fn life_id_number(id: &str) -> u128 {
    let canonical = id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => matches!(c, '0'..='9' | 'a'..='f'),
        });
    if canonical {
        let hex: String = id.chars().filter(|c| *c != '-').collect();
        if let Ok(n) = u128::from_str_radix(&hex, 16) {
            return n;
        }
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    u128::from_be_bytes(digest[..16].try_into().expect("16 bytes"))
}

impl Store {
    /// Connects (and keeps reconnecting) to the Redis or Redis Cluster at `url` and opens
    /// its keyspace: an existing one is used with the number of shards it was created
    /// with (`shards`, when given, must match it); an empty one is created with
    /// `shards` (default 32). A keyspace written before shards is refused: it needs
    /// `kairos migrate`.
    pub async fn connect(
        url: &str,
        key_prefix: &str,
        timezone: Tz,
        shards: Option<u32>,
    ) -> Result<Store, OpenError> {
        let target = Target::parse(url).map_err(OpenError::Layout)?;
        let conn = Conn::open(&target).await?;
        let keys = Keys::new(key_prefix);
        let scripts = Arc::new(Scripts::load());
        let count = open_layout(&conn, &keys, &scripts, shards).await?;
        Ok(Store::with_shards(
            conn, target, key_prefix, timezone, count, scripts,
        ))
    }

    /// A store over `conn` with `count` shards, whatever Redis says (for `kairos migrate`,
    /// which writes the keyspace's meta last).
    pub(crate) fn with_shards(
        conn: Conn,
        target: Target,
        key_prefix: &str,
        timezone: Tz,
        count: u32,
        scripts: Arc<Scripts>,
    ) -> Store {
        let shards: Vec<ShardKeys> = (0..count)
            .map(|i| ShardKeys::new(key_prefix, i, count))
            .collect();
        // On a cluster, each shard's slot gets a connection of its own, so that a master
        // that fails stalls only its own shards' calls (store/conn.rs).
        conn.dedicate(shards.iter().map(|k| k.slot() as u16));
        Store {
            conn,
            target,
            keys: Keys::new(key_prefix),
            placement: Placement { shards: count },
            shards: Arc::new(shards),
            scripts,
            timezone,
            runs_max_len: 0,
            min_replicas_ack: 0,
            memory: Arc::new(MemoryState::new(count)),
            acks: Arc::default(),
        }
    }

    /// Keeps a `runs` stream per shard capped near `max_len` (0, the default: none).
    pub fn with_runs_max_len(mut self, max_len: usize) -> Self {
        self.runs_max_len = max_len;
        self
    }

    /// Answers a booking only once `replicas` replicas hold it (`WAIT`).
    pub fn with_min_replicas_ack(mut self, replicas: u32) -> Self {
        self.min_replicas_ack = replicas;
        self
    }

    /// How full each shard's Redis was at the last look (see `store::memory`).
    pub fn memory(&self) -> &MemoryState {
        &self.memory
    }

    /// A handle on the shared connection.
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Where this store connects (for pub/sub connections of its own).
    pub fn target(&self) -> &Target {
        &self.target
    }

    pub fn shard_count(&self) -> u32 {
        self.placement.shards
    }

    pub fn shard(&self, i: u32) -> &ShardKeys {
        &self.shards[i as usize]
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The shard whose notify channel this is, if it is one of this keyspace's.
    pub fn shard_of_channel(&self, channel: &str) -> Option<u32> {
        let rest = channel
            .strip_prefix(&self.keys.prefix)?
            .strip_prefix("{s")?;
        let (index, _) = rest.split_once('.').or_else(|| rest.split_once('}'))?;
        let index: u32 = index.parse().ok()?;
        (index < self.shard_count() && self.shard(index).notify() == channel).then_some(index)
    }

    /// The pattern that matches every shard's notify channel.
    pub fn notify_pattern(&self) -> String {
        let mut escaped = String::new();
        for c in self.keys.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        format!("{escaped}{{s*}}:notify")
    }

    pub async fn ping(&self) -> redis::RedisResult<()> {
        redis::cmd("PING")
            .query_async::<String>(&mut self.conn())
            .await
            .map(|_| ())
    }

    /// Epoch ms as RFC 3339 in the configured zone, as times are stored.
    pub fn fmt_time(&self, ms: i64) -> String {
        self.fmt(ms)
    }

    fn fmt(&self, ms: i64) -> String {
        rfc3339(ms, self.timezone)
    }

    /// Who uses one plugin across every shard: the number of unfinished Lives booked
    /// with it, and the names of the timers whose action names it (for `GET` and
    /// `DELETE /plugins/{name}`), read inside Redis: no timer is shipped to the host.
    /// A shard's Lives, then its timers, are read a page of [`PLUGIN_USERS_PAGE`] at a
    /// time, so that a plugin with very many Lives (or a shard with very many timers)
    /// never holds Redis for long at once.
    pub async fn plugin_users(&self, name: &str) -> Result<(u64, Vec<String>), ApiError> {
        let counts = (0..self.shard_count()).map(|shard| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            async move {
                // SSCAN may return a member twice (when the set is resized between two
                // pages): each Life counts once.
                let mut lives = std::collections::HashSet::new();
                let mut timers = Vec::new();
                for (what, first) in [("lives", "0"), ("timers", "-")] {
                    let mut cursor = first.to_string();
                    // A pass ends when the cursor comes back '0'; the bound only guards
                    // against a set that grows faster than it is read.
                    for page in 0..=MAX_PLUGIN_USERS_PAGES {
                        if page == MAX_PLUGIN_USERS_PAGES {
                            tracing::warn!(
                                plugin = name,
                                shard,
                                what,
                                "stopped reading a plugin's users after {MAX_PLUGIN_USERS_PAGES} pages; the count is a lower bound"
                            );
                            break;
                        }
                        let (next, found): (String, Vec<String>) = self
                            .scripts
                            .plugin_users
                            .key(k.plugin_lives(name))
                            .key(k.timers())
                            .arg(&k.prefix)
                            .arg(name)
                            .arg(what)
                            .arg(&cursor)
                            .arg(PLUGIN_USERS_PAGE)
                            .invoke_async(&mut conn)
                            .await?;
                        if what == "lives" {
                            lives.extend(found.iter().map(|id| life_id_number(id)));
                        } else {
                            timers.extend(found);
                        }
                        if next == "0" {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok::<_, redis::RedisError>((lives.len() as u64, timers))
            }
        });
        let mut lives = 0;
        let mut timers = Vec::new();
        for (n, names) in futures_util::future::try_join_all(counts).await? {
            lives += n;
            timers.extend(names);
        }
        timers.sort();
        Ok((lives, timers))
    }

    // ---- firing engine ----

    /// Claims up to `limit` Plans of `shard` due before `until_ms` (queue tasks: before
    /// `tasks_until_ms`) for `host` under generation `gen`.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        shard: u32,
        host: &str,
        gen: u64,
        until_ms: i64,
        limit: usize,
        tasks_until_ms: i64,
        task_limit: usize,
    ) -> redis::RedisResult<ClaimReply> {
        let k = self.shard(shard);
        type Row = (String, String, String, String, String, String, String);
        let (word, rows, next_task): (String, Vec<Row>, String) = self
            .scripts
            .claim
            .key(k.due())
            .key(k.held())
            .key(k.owner())
            .key(k.due_tasks())
            .key(k.claim_seq())
            .arg(&k.prefix)
            .arg(host)
            .arg(gen)
            .arg(until_ms)
            .arg(limit)
            .arg(tasks_until_ms)
            .arg(task_limit)
            .invoke_async(&mut self.conn())
            .await?;
        match word.as_str() {
            "lost" => return Ok(ClaimReply::Lost),
            "expired" => return Ok(ClaimReply::Expired),
            _ => {}
        }
        let plans = rows
            .into_iter()
            .map(
                |(plan_id, fire, claim, action, attempts, rid, opts)| Claimed {
                    plan_id,
                    shard,
                    fire_at_ms: fire.parse::<f64>().map(|f| f as i64).unwrap_or(0),
                    claim,
                    action,
                    attempts: attempts.parse().unwrap_or(0),
                    resource_id: (!rid.is_empty()).then_some(rid),
                    opts: if opts.is_empty() {
                        RunOpts::default()
                    } else {
                        serde_json::from_str(&opts).unwrap_or_default()
                    },
                },
            )
            .collect();
        Ok(ClaimReply::Claimed {
            plans,
            next_task_ms: next_task.parse::<f64>().ok().map(|f| f as i64),
        })
    }

    /// Fencing check and Preset -> Running for a batch of one shard's Plans (see
    /// `scripts/start_run.lua`); lateness and the lease are judged by Redis's clock.
    pub async fn start_runs(
        &self,
        shard: u32,
        host: &str,
        gen: u64,
        plans: &[&Claimed],
        birth_delay_limit_ms: i64,
    ) -> redis::RedisResult<Vec<StartOutcome>> {
        let k = self.shard(shard);
        let mut invocation = self.scripts.start_run.prepare_invoke();
        invocation
            .key(k.held())
            .key(k.runs())
            .key(k.owner())
            .arg(&k.prefix)
            .arg(host)
            .arg(gen)
            .arg(birth_delay_limit_ms)
            .arg(self.runs_max_len);
        for plan in plans {
            invocation.arg(&plan.plan_id).arg(&plan.claim);
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        Ok(reply
            .iter()
            .map(|r| match r.as_str() {
                "busy" => StartOutcome::Busy,
                "invalidated" => StartOutcome::Invalidated,
                "deferred" => StartOutcome::Deferred,
                "dropped" => StartOutcome::Dropped,
                "expired" => StartOutcome::Expired,
                other => match other.strip_prefix("run:").and_then(|a| a.parse().ok()) {
                    Some(attempts) => StartOutcome::Run { attempts },
                    None => StartOutcome::Lost,
                },
            })
            .collect())
    }

    /// Records a batch of one shard's runs and moves the state machines on (see
    /// `scripts/finish_run.lua`). Returns per run whether this host still held the Plan.
    pub async fn finish_runs(
        &self,
        shard: u32,
        host: &str,
        runs: &[FinishedRun],
        now_ms: i64,
        notify_before_ms: i64,
    ) -> redis::RedisResult<Vec<bool>> {
        let k = self.shard(shard);
        let mut invocation = self.scripts.finish_run.prepare_invoke();
        invocation
            .key(k.held())
            .key(k.due())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(host)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(self.runs_max_len);
        for run in runs {
            let (outcome, next_ms) = match run.outcome {
                RunOutcome::Done => ("done", now_ms),
                RunOutcome::Retry { next_ms } => ("retry", next_ms),
                RunOutcome::Failed => ("failed", now_ms),
            };
            let r = &run.record;
            let kind = run
                .plan
                .life_and_kind()
                .map(|(_, k)| k.as_str())
                .unwrap_or("birth");
            let record = run_record_json(host, kind, r);
            invocation
                .arg(&run.plan.plan_id)
                .arg(&run.plan.claim)
                .arg(outcome)
                .arg(next_ms)
                .arg(r.status.map(|s| s.to_string()).unwrap_or_default())
                .arg(r.error.as_deref().unwrap_or(""))
                .arg(r.attempt)
                .arg(r.outcome)
                .arg(record.to_string());
            let (callback, callback_action) = Callback::args(&run.callback);
            invocation.arg(callback).arg(callback_action);
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        Ok(reply.iter().map(|r| r == "ok").collect())
    }

    /// Plans waiting in every shard's due sets (queue tasks included), and hosts alive at
    /// `now_ms`.
    /// The earliest fire time after `after_ms` (None: any) of a Plan not yet finished, in
    /// every shard: waiting in `due` or `due_tasks`, or held (claimed or running).
    pub async fn earliest_pending_ms(
        &self,
        after_ms: Option<i64>,
    ) -> redis::RedisResult<Option<i64>> {
        Ok(self
            .earliest_pending_by_shard(after_ms)
            .await?
            .into_iter()
            .map(|(_, at)| at)
            .min())
    }

    /// [`earliest_pending_ms`](Self::earliest_pending_ms) of each shard that has one.
    pub async fn earliest_pending_by_shard(
        &self,
        after_ms: Option<i64>,
    ) -> redis::RedisResult<Vec<(u32, i64)>> {
        let min = after_ms.map_or_else(|| "-inf".to_string(), |ms| format!("({ms}"));
        let firsts = (0..self.shard_count()).map(|shard| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            let min = min.clone();
            async move {
                type First = Vec<(String, f64)>;
                let mut pipe = redis::pipe();
                for key in [k.due(), k.due_tasks(), k.held()] {
                    pipe.zrangebyscore_limit_withscores(key, &min, "+inf", 0, 1);
                }
                pipe.query_async::<(First, First, First)>(&mut conn)
                    .await
                    .map(|sets| (shard, sets))
            }
        });
        let mut earliest = Vec::new();
        for (shard, (due, tasks, held)) in futures_util::future::try_join_all(firsts).await? {
            let first = due
                .into_iter()
                .chain(tasks)
                .chain(held)
                .map(|(_, at)| at as i64)
                .min();
            if let Some(at) = first {
                earliest.push((shard, at));
            }
        }
        Ok(earliest)
    }

    pub async fn cluster_stats(&self, now_ms: i64) -> redis::RedisResult<ClusterStats> {
        let counts = (0..self.shard_count()).map(|shard| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            async move {
                redis::pipe()
                    .zcard(k.due())
                    .zcard(k.due_tasks())
                    .zcard(k.finished())
                    .zcount(k.due(), "-inf", now_ms)
                    .zcount(k.due_tasks(), "-inf", now_ms)
                    .zrange_withscores(k.due(), 0, 0)
                    .hgetall(k.census())
                    .query_async::<ShardCounts>(&mut conn)
                    .await
            }
        });
        let mut stats = ClusterStats::default();
        let counts = futures_util::future::try_join_all(counts).await?;
        for (shard, (due, tasks, finished, overdue, overdue_tasks, first, census)) in
            counts.into_iter().enumerate()
        {
            let census = if census.contains_key("v") {
                census
            } else {
                self.census_rebuild(shard as u32).await?
            };
            for (state, n) in census {
                if let Some(i) = LIFE_STATES.iter().position(|s| *s == state) {
                    stats.lives[i] += n;
                }
            }
            stats.due += due + tasks;
            stats.finished += finished;
            stats.overdue += overdue;
            stats.overdue_tasks += overdue_tasks;
            if let Some((_, at)) = first.first() {
                stats.oldest_overdue_ms = stats.oldest_overdue_ms.max(now_ms - *at as i64);
            }
        }
        // Hosts announce themselves by the machine's clock, which the engine's clock
        // (`--clock manual`) may be ahead of.
        stats.hosts = redis::cmd("ZCOUNT")
            .arg(self.keys.hosts())
            .arg(chrono::Utc::now().timestamp_millis())
            .arg("+inf")
            .query_async(&mut self.conn())
            .await?;
        stats.failed_last_hour = self.failures_since(now_minute() - 59).await?;
        Ok(stats)
    }

    /// Counts a shard's Lives per state afresh when its census is not marked yet (a
    /// keyspace written before it), and answers the census.
    async fn census_rebuild(&self, shard: u32) -> redis::RedisResult<HashMap<String, i64>> {
        let k = self.shard(shard);
        let mut conn = self.conn();
        let _: i64 = self
            .scripts
            .census_rebuild
            .key(k.census())
            .arg(&k.prefix)
            .invoke_async(&mut conn)
            .await?;
        conn.hgetall(k.census()).await
    }

    /// Counts a run that failed for good in the failures of the current minute, and
    /// forgets minutes older than two hours (looked for once a minute, at its first
    /// failure).
    pub async fn count_failure(&self) -> redis::RedisResult<()> {
        let key = self.keys.failures();
        let minute = now_minute();
        let mut conn = self.conn();
        let n: i64 = conn.hincr(&key, minute, 1).await?;
        if n == 1 {
            let minutes: Vec<i64> = conn.hkeys(&key).await?;
            let old: Vec<i64> = minutes.into_iter().filter(|m| *m < minute - 120).collect();
            if !old.is_empty() {
                let _: i64 = conn.hdel(&key, old).await?;
            }
        }
        Ok(())
    }

    /// Runs that failed for good since epoch minute `from` (all hosts).
    pub async fn failures_since(&self, from: i64) -> redis::RedisResult<i64> {
        let counts: HashMap<i64, i64> = self.conn().hgetall(self.keys.failures()).await?;
        Ok(counts
            .into_iter()
            .filter(|(minute, _)| *minute >= from)
            .map(|(_, n)| n)
            .sum())
    }
}

/// The current minute of the machine's clock, since the epoch.
fn now_minute() -> i64 {
    chrono::Utc::now().timestamp() / 60
}

/// What `cluster_stats` reads of one shard: due, due tasks, finished, overdue, overdue
/// tasks, the first due Plan, the census.
type ShardCounts = (
    i64,
    i64,
    i64,
    i64,
    i64,
    Vec<(String, f64)>,
    HashMap<String, i64>,
);

/// The states of a Life (SPEC section 1), in the order `ClusterStats::lives` counts them.
pub const LIFE_STATES: [&str; 5] = ["Inexistent", "Alive", "Dead", "Stillbirth", "Invalidated"];

/// Counts over every shard, for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClusterStats {
    /// Plans and tasks waiting to be claimed.
    pub due: i64,
    /// Finished Lives kept as history.
    pub finished: i64,
    /// Plans (of Lives and timers) past their fire time and not yet claimed.
    pub overdue: i64,
    /// Queue tasks that may run now and wait (for a host, their queue's rate or slots).
    pub overdue_tasks: i64,
    /// How long the oldest overdue Plan has waited (0: none).
    pub oldest_overdue_ms: i64,
    /// Hosts whose lease is current.
    pub hosts: i64,
    /// Lives per state, in the order of [`LIFE_STATES`].
    pub lives: [i64; 5],
    /// Runs that failed for good in the last hour (the current minute and the 59
    /// before it), all hosts.
    pub failed_last_hour: i64,
}

/// What a `claim` call got.
#[derive(Debug)]
pub enum ClaimReply {
    Claimed {
        plans: Vec<Claimed>,
        /// When the shard's first task left in `due_tasks` is due.
        next_task_ms: Option<i64>,
    },
    /// The shard is another host's now.
    Lost,
    /// This host's lease on the shard ran out: renew, then claim.
    Expired,
}

/// Reads or creates the keyspace's `meta`; returns its number of shards.
async fn open_layout(
    conn: &Conn,
    keys: &Keys,
    scripts: &Scripts,
    requested: Option<u32>,
) -> Result<u32, OpenError> {
    let mut conn = conn.clone();
    let meta: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.meta())
        .query_async(&mut conn)
        .await?;
    if meta.is_empty() {
        for key in keys.legacy() {
            let exists: bool = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            if exists {
                return Err(OpenError::Layout(format!(
                    "this Redis holds kairos data written before shards (`{key}` exists): stop the hosts of the earlier version, then run `kairos migrate` once to bring it over"
                )));
            }
        }
    }
    let want = requested.unwrap_or(DEFAULT_SHARDS);
    if !(1..=MAX_SHARDS).contains(&want) {
        return Err(OpenError::Layout(format!(
            "--shards must be 1 to {MAX_SHARDS}, not {want}"
        )));
    }
    let (layout, shards): (Option<u32>, Option<u32>) = scripts
        .meta_init
        .key(keys.meta())
        .arg(&keys.prefix)
        .arg(LAYOUT)
        .arg(want)
        .arg(chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true))
        .invoke_async(&mut conn)
        .await?;
    if layout == Some(2) {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` was written by an earlier kairos (layout 2, a hash per Plan): stop its hosts, then run `kairos migrate` once to fold each Life's Plans into its hash (layout {LAYOUT})",
            keys.prefix
        )));
    }
    if layout != Some(LAYOUT) {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` has layout {layout:?}; this kairos reads layout {LAYOUT} only",
            keys.prefix
        )));
    }
    let shards = shards.unwrap_or(0);
    if let Some(requested) = requested {
        if requested != shards {
            return Err(OpenError::Layout(format!(
                "the keyspace under `{}` was created with {shards} shards, and that number never changes: start with --shards {shards} (or leave --shards out)",
                keys.prefix
            )));
        }
    }
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` records {shards} shards, which is not a number this kairos can use",
            keys.prefix
        )));
    }
    Ok(shards)
}

/// A run as written to history: the same JSON for Lives, timers and tasks.
pub(crate) fn run_record_json(host: &str, plan: &str, r: &RunRecord) -> Value {
    let mut record = json!({
        "plan": plan,
        "attempt": r.attempt,
        "should_run_at": r.should_run_at_ms,
        "started_at": r.started_at_ms,
        "duration_ms": r.duration_ms,
        "host": host,
        "outcome": r.outcome,
    });
    if let Some(status) = r.status {
        record["status"] = Value::from(status);
    }
    if let Some(error) = &r.error {
        record["error"] = Value::from(error.as_str());
    }
    if let Some(output) = &r.output {
        record["output"] = output.clone();
    }
    if !r.logs.is_empty() {
        record["logs"] = json!(r.logs);
    }
    if let Some(ms) = r.retry_after_ms {
        record["retry_after_ms"] = Value::from(ms);
    }
    record
}

fn conflict_error(rid: &str, other: Option<&String>) -> ApiError {
    ApiError::conflict(
        "resource_conflict",
        format!(
            "resource `{rid}` is booked by Life `{}` within execution_delay_guard_time of these times",
            other.map(String::as_str).unwrap_or("?")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_life_id_is_its_uuids_number_and_anything_else_a_hash() {
        assert_eq!(
            life_id_number("7f000000-0000-4000-8000-000000000a01"),
            0x7f000000_0000_4000_8000_000000000a01
        );
        let odd = life_id_number("not-a-uuid");
        assert_eq!(odd, life_id_number("not-a-uuid"));
        assert_ne!(odd, life_id_number("not-a-uuie"));
        // Ids a client chose that read as the same hex are two ids.
        let a = "a".repeat(32);
        assert_ne!(life_id_number(&a), life_id_number(&a.to_uppercase()));
        assert_ne!(
            life_id_number("7F000000-0000-4000-8000-000000000A01"),
            life_id_number("7f000000-0000-4000-8000-000000000a01")
        );
        assert_ne!(
            life_id_number("7f00000000004000-8000-000000000a01"),
            life_id_number("7f000000-0000-4000-8000-000000000a01")
        );
    }

    #[test]
    fn a_shebang_stays_the_first_line_of_a_script() {
        let text = script_text(include_str!("scripts/finish_run.lua"));
        assert!(
            text.starts_with("#!lua flags=allow-oom\n-- Helpers"),
            "{}",
            &text[..80]
        );
        assert_eq!(text.matches("#!lua").count(), 1);
        let text = script_text(include_str!("scripts/book.lua"));
        assert!(text.starts_with("-- Helpers"));
    }

    #[test]
    fn plan_ids_say_whose_plan_it_is() {
        let claimed = |id: &str| Claimed {
            plan_id: id.into(),
            shard: 0,
            fire_at_ms: 0,
            claim: "1".into(),
            action: String::new(),
            attempts: 0,
            resource_id: None,
            opts: RunOpts::default(),
        };
        assert_eq!(
            claimed("6f69:death").owner(),
            Some(Owner::Life("6f69", PlanKind::Death))
        );
        assert_eq!(
            claimed("nightly-report:timer").owner(),
            Some(Owner::Timer("nightly-report"))
        );
        assert_eq!(
            claimed("mail/welcome-42:task").owner(),
            Some(Owner::Task {
                queue: "mail",
                task: "welcome-42"
            })
        );
        assert_eq!(claimed("x:sideways").owner(), None);
        assert_eq!(claimed("no-slash:task").owner(), None);
    }

    #[test]
    fn rfc3339_uses_the_zone() {
        assert_eq!(rfc3339(0, chrono_tz::UTC), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1500, chrono_tz::Asia::Tokyo),
            "1970-01-01T09:00:01.500+09:00"
        );
    }
}
