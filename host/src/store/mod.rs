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

mod book_batch;
mod conn;
mod firing;
mod idempotency;
pub mod inspect;
mod life_changes;
mod life_list;
mod life_sweep;
mod life_views;
pub mod lifecycle;
mod lives;
mod lua_prelude;
mod memory;
pub mod migrate;
mod migrate4;
pub mod outcome;
mod ownership;
mod queues;
pub mod record;
mod replicas;
pub mod runs;
pub mod shards;
mod slot_router;
pub mod slowlog;
mod stats;
mod timers;

pub use conn::{Conn, Target, CLUSTER_SCHEME};
pub use firing::{
    run_record_json, Callback, ClaimReply, Claimed, FinishedRun, Owner, RunOutcome, RunRecord,
    StartOutcome, StartSection,
};
pub use idempotency::IdemBegin;
pub use life_changes::{CancelOutcome, Loaded};
pub use life_list::{ListFilter, Page};
pub use life_views::booked_view;
pub use lives::{IdOrigin, IdemBooked};
pub use memory::{Durability, MemoryState, RedisMemory, REFUSE_AT, SHED_AT};
pub use ownership::{preferred_host, ShardOwner, Takeover};
pub use queues::{LeasedTask, NewTask, NewTaskWork, QueueCounts, TaskAddRefusal, TaskPage};
pub use shards::{Placement, ShardKeys};
pub use stats::{ClusterStats, LIFE_STATES, PLUGIN_USERS_PAGE};
pub use timers::{NextRun, TimerFinish, TimerPut, TimerSlot, TIMER_RUNS_KEPT};

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use chrono::{SecondsFormat, TimeZone};
use chrono_tz::Tz;
use lua_prelude::script_with;
pub(crate) use lua_prelude::Scripts;

use crate::error::ApiError;

/// The name of each of this build's scripts by its SHA-1, the hash `EVALSHA` calls it by
/// (and `SLOWLOG GET` and `MONITOR` show): for a benchmark or an operator that reads
/// Redis's own view of the calls.
pub fn script_names_by_hash() -> HashMap<String, &'static str> {
    Scripts::load()
        .hashes()
        .into_iter()
        .map(|(name, hash)| (hash, name))
        .collect()
}

/// The layout this code reads and writes (`meta.layout`): 1 had no shards, 2 a hash per
/// Plan, 3 a Life's Plans folded into its hash, 4 a Life one compact record in a bucket,
/// and the large sorted sets trees of small ones (docs/redis-layout.md).
pub const LAYOUT: u32 = 4;
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
    /// What the keyspace is: `layout`, `shards`, `created_at`, `records`.
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
    /// The keys of shard `i` of a keyspace of `count` shards.
    pub fn shard(&self, i: u32, count: u32) -> ShardKeys {
        let configured = self.prefix.strip_suffix(':').unwrap_or(&self.prefix);
        ShardKeys::new(configured, i, count)
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
    /// Bookings' group commit (store/book_batch.rs), each started at its first
    /// booking: one on a standalone Redis, one per shard on a cluster.
    bookers: Arc<Vec<OnceLock<book_batch::Booker>>>,
}

/// A Life's id as a number, to count each once in 16 bytes: a uuid as written by kairos
/// (lowercase, with dashes) is its own number; any other id a client chose (up to 64
/// letters, digits, `-`, `_`) is the first 16 bytes of its SHA-256, so that two ids that
/// differ only in case or dashes stay two.
pub(crate) fn life_id_number(id: &str) -> u128 {
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
        // `book` loaded before the first booking (store/book_batch.rs): the first calls
        // that found it missing would each be retried after loading it, and could
        // overtake one another. (After a Redis restart they still can, as before.)
        let _ = scripts.book.load_async(&mut conn.clone()).await;
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
        let cluster = target.is_cluster();
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
            bookers: Arc::new(
                (0..if cluster { count } else { 1 })
                    .map(|_| OnceLock::new())
                    .collect(),
            ),
        }
    }

    /// The group commit that books into `shard`, started on first use (in the runtime
    /// that books).
    fn booker(&self, shard: u32) -> &book_batch::Booker {
        // A cluster has a batcher per shard (its node's bookings only), a standalone
        // Redis one for every shard.
        let i = if self.target.is_cluster() { shard } else { 0 };
        self.bookers[i as usize].get_or_init(|| {
            book_batch::Booker::start(self.conn.clone(), Arc::new(self.scripts.book.clone()))
        })
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

    /// Whether the store is a Redis Cluster (its shards on several nodes) rather than one
    /// standalone Redis that holds every shard.
    pub fn is_cluster(&self) -> bool {
        self.target.is_cluster()
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
}

/// Reads or creates the keyspace's `meta`; returns its number of shards.
async fn open_layout(
    conn: &Conn,
    keys: &Keys,
    scripts: &Scripts,
    requested: Option<u32>,
) -> Result<u32, OpenError> {
    let mut conn = conn.clone();
    let meta: HashMap<String, String> = redis::cmd("HGETALL")
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
    let (layout, shards, records): (Option<u32>, Option<u32>, Option<u32>) = scripts
        .meta_init
        .key(keys.meta())
        .arg(&keys.prefix)
        .arg(LAYOUT)
        .arg(want)
        .arg(chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true))
        .arg(record::RECORD_FORMAT)
        .invoke_async(&mut conn)
        .await?;
    let earlier = match layout {
        Some(2) => Some("layout 2, a hash per Plan"),
        Some(3) => Some("layout 3, a hash per Life"),
        _ => None,
    };
    if let Some(earlier) = earlier {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` was written by an earlier kairos ({earlier}): stop its hosts, then run `kairos migrate` once to fold each Life into one compact record (layout {LAYOUT})",
            keys.prefix
        )));
    }
    if layout != Some(LAYOUT) {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` has layout {layout:?}; this kairos reads layout {LAYOUT} only",
            keys.prefix
        )));
    }
    if let Some(records) = records.filter(|&r| r > record::RECORD_FORMAT) {
        return Err(OpenError::Layout(format!(
            "the keyspace under `{}` holds records of format {records}, written by a later kairos; this one reads format {} and older: run the later build on every host",
            keys.prefix,
            record::RECORD_FORMAT
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
    if meta.is_empty() {
        // A keyspace created now (by this host or one beside it): its scripts count
        // every Life from the first, so each shard's census is exact as it stands. Marked
        // so, it is never counted afresh, which would read every record of the shard in
        // one script (51 ms a shard at 31,000 Lives, holding Redis).
        let marks = (0..shards).map(|shard| {
            let mut conn = conn.clone();
            let census = keys.shard(shard, shards).census();
            async move {
                redis::cmd("HSETNX")
                    .arg(census)
                    .arg("v")
                    .arg(1)
                    .query_async::<i64>(&mut conn)
                    .await
            }
        });
        futures_util::future::try_join_all(marks).await?;
    }
    Ok(shards)
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
    use crate::model::{PlanKind, RunOpts};

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
            record: None,
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
