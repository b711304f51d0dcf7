//! `kairos migrate`: brings a keyspace of an earlier layout over to this version's, with
//! every host stopped. Layout 1 (before shards: every key under `{prefix}:`, one slot per
//! key) moves into the shards, on the standalone Redis it lives in. Layout 2 (sharded,
//! each Plan of a Life a hash of its own) has each Life's Plans folded into the Life's
//! hash, in place, on a standalone Redis or a cluster ([`Migration::fold_plans`]).
//!
//! Each object moves whole in one script call (`scripts/migrate.lua`): a Life with its
//! Plans and index entries, a timer, a queue's hash and indexes, each task, each
//! tombstone. The keyspace's `meta` is written last, so hosts of this version refuse to
//! start on a half-migrated keyspace, and a migration cut off anywhere is finished by
//! running it again. Plans that a host of the old version still held (one killed
//! before it could hand back) go back to their due sets on the way, as a takeover would
//! put them. Nothing is copied: keys are renamed, so the migration needs no extra memory.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};

use super::{open_layout, Conn, Keys, Scripts, Store, Target, LAYOUT};

/// Objects looked at per batch.
const BATCH: isize = 500;
/// Fold calls in flight at once: the connection pipelines them, so a Life costs its
/// script's time in Redis, not a round trip.
const FOLD_IN_FLIGHT: usize = 64;

/// What a migration moved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Layout 2 to 3: the Lives whose Plans were folded into their hash. The other
    /// counts are of a migration from layout 1 (which folds as it moves).
    pub folded_lives: u64,
    pub lives: u64,
    pub timers: u64,
    pub queues: u64,
    pub tasks: u64,
    pub tombstones: u64,
    pub registry_keys: u64,
    /// Layout 3 to 4: the Lives folded into records (every migration ends with it).
    pub records: u64,
    /// Plans a host of the old version still held, handed back.
    pub handed_back: u64,
    pub shards: u32,
    /// False when the keyspace was in this version's layout already.
    pub migrated: bool,
}

impl MigrateReport {
    /// What `kairos migrate` prints.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.migrated {
            lines.push(format!(
                "the keyspace is in this version's layout already ({} shards); nothing to do",
                self.shards
            ));
            return lines;
        }
        if self.lives + self.timers + self.queues + self.tasks + self.registry_keys > 0 {
            lines.push(format!(
                "moved into {} shards: {} Lives, {} timers, {} queues with {} tasks, {} tombstones, {} plugin registry keys",
                self.shards,
                self.lives,
                self.timers,
                self.queues,
                self.tasks,
                self.tombstones,
                self.registry_keys
            ));
        }
        if self.folded_lives > 0 {
            lines.push(format!(
                "folded the Plans of {} Lives into their Lives' hashes (layout 3)",
                self.folded_lives
            ));
        }
        lines.push(format!(
            "folded {} Lives into compact records ({} shards, layout {LAYOUT}); {} Plans a stopped host still held went back to their due sets",
            self.records, self.shards, self.handed_back
        ));
        lines
    }
}

/// Migrates the keyspace under `key_prefix` at `url` into `shards` shards (default 32).
/// `force` skips the check that no host of the old version is alive.
pub async fn migrate(
    url: &str,
    key_prefix: &str,
    shards: Option<u32>,
    force: bool,
) -> Result<MigrateReport, String> {
    let target = Target::parse(url)?;
    let conn = Conn::open(&target)
        .await
        .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?;
    let keys = Keys::new(key_prefix);
    let scripts = Arc::new(Scripts::load());
    let mut c = conn.clone();
    let meta: (Option<u32>, Option<u32>) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg("layout")
        .arg("shards")
        .query_async(&mut c)
        .await
        .map_err(|e| e.to_string())?;
    match meta {
        (Some(layout @ (2 | 3)), Some(count)) => {
            if !force {
                no_live_hosts(&keys, &mut c).await?;
            }
            let store = Store::with_shards(
                conn,
                target,
                key_prefix,
                chrono_tz::UTC,
                count,
                scripts.clone(),
            );
            let mut m = Migration {
                store: &store,
                old: keys.prefix.clone(),
                report: MigrateReport {
                    shards: count,
                    migrated: true,
                    ..Default::default()
                },
            };
            if layout == 2 {
                m.fold_plans()
                    .await
                    .map_err(|e| format!("migration stopped: {e}; run it again to go on"))?;
                set_layout(&keys, &mut c, 3).await?;
            }
            m.fold_records().await?;
            set_layout(&keys, &mut c, LAYOUT).await?;
            m.drop_fold_markers().await?;
            return Ok(m.report);
        }
        (None, None) => {}
        _ => {
            let count = open_layout(&conn, &keys, &scripts, shards)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(MigrateReport {
                shards: count,
                ..Default::default()
            });
        }
    }
    if target.is_cluster() {
        return Err("a keyspace written before shards lives on one redis-server: migrate it there (then move it to a cluster with `redis-cli --cluster import` if you like)".into());
    }
    let count = shards.unwrap_or(super::DEFAULT_SHARDS);
    if !(1..=super::MAX_SHARDS).contains(&count) {
        return Err(format!("--shards must be 1 to {}", super::MAX_SHARDS));
    }
    if !force {
        no_live_hosts(&keys, &mut c).await?;
    }
    let store = Store::with_shards(
        conn,
        target,
        key_prefix,
        chrono_tz::UTC,
        count,
        scripts.clone(),
    );
    let mut m = Migration {
        store: &store,
        old: keys.prefix.clone(),
        report: MigrateReport {
            shards: count,
            migrated: true,
            ..Default::default()
        },
    };
    m.run()
        .await
        .map_err(|e| format!("migration stopped: {e}; run it again to go on"))?;
    // Layout 1 moves into layout 3's shapes (`scripts/migrate.lua`), which are then
    // folded into records: the meta says 3 in between, so that a run cut off goes on
    // from there.
    let (layout, recorded, _): (Option<u32>, Option<u32>, Option<u32>) = scripts
        .meta_init
        .key(keys.meta())
        .arg(&keys.prefix)
        .arg(3)
        .arg(count)
        .arg(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .invoke_async(&mut store.conn())
        .await
        .map_err(|e| e.to_string())?;
    if layout != Some(3) || recorded != Some(count) {
        return Err(format!(
            "the keyspace's meta says layout {layout:?} with {recorded:?} shards"
        ));
    }
    m.fold_records().await?;
    set_layout(&keys, &mut c, LAYOUT).await?;
    m.drop_fold_markers().await?;
    Ok(m.report)
}

/// Records the keyspace's layout (and for this build's, the format of its records).
async fn set_layout(keys: &Keys, conn: &mut Conn, layout: u32) -> Result<(), String> {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(keys.meta()).arg("layout").arg(layout);
    if layout == LAYOUT {
        cmd.arg("records").arg(super::record::RECORD_FORMAT);
    }
    cmd.query_async::<()>(conn).await.map_err(|e| e.to_string())
}

/// Refuses while a host of the earlier version is alive (listed in `hosts`).
async fn no_live_hosts(keys: &Keys, conn: &mut Conn) -> Result<(), String> {
    let now = chrono::Utc::now().timestamp_millis();
    let live: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(keys.hosts())
        .arg(now)
        .arg("+inf")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    if live.is_empty() {
        return Ok(());
    }
    Err(format!(
        "hosts of the earlier version are alive ({}): stop them all first (or wait for their leases to run out), or pass --force",
        live.join(", ")
    ))
}

struct Migration<'a> {
    store: &'a Store,
    /// The old layout's prefix, `{key_prefix}:`.
    old: String,
    report: MigrateReport,
}

type RedisResult<T> = std::result::Result<T, redis::RedisError>;

impl Migration<'_> {
    fn old(&self, rest: &str) -> String {
        format!("{}{rest}", self.old)
    }

    async fn cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> RedisResult<T> {
        cmd.query_async(&mut self.store.conn()).await
    }

    /// Moves one object into `shard` (see `scripts/migrate.lua`); true when it moved.
    async fn object(
        &self,
        shard: u32,
        mode: &str,
        name: &str,
        extra: &[String],
    ) -> RedisResult<bool> {
        let k = self.store.shard(shard);
        let mut invocation = self.store.scripts.migrate.prepare_invoke();
        invocation
            .key(k.owner())
            .arg(&k.prefix)
            .arg(&self.old)
            .arg(mode)
            .arg(name);
        for e in extra {
            invocation.arg(e);
        }
        let moved: i64 = invocation.invoke_async(&mut self.store.conn()).await?;
        Ok(moved == 1)
    }

    /// Keys matching `pattern`, all of them (SCAN).
    async fn scan(&self, pattern: &str) -> RedisResult<Vec<String>> {
        let mut out = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .cmd(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            out.extend(keys);
            if next == 0 {
                return Ok(out.into_iter().collect());
            }
            cursor = next;
        }
    }

    /// Layout 3 to 4 (`migrate4.rs`), then the shards' fold markers go.
    async fn fold_records(&mut self) -> Result<(), String> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let (records, handed) = self
            .store
            .fold_records(now_ms)
            .await
            .map_err(|e| format!("migration stopped: {e}; run it again to go on"))?;
        self.report.records = records;
        self.report.handed_back += handed;
        Ok(())
    }

    async fn drop_fold_markers(&self) -> Result<(), String> {
        self.store
            .drop_fold_markers()
            .await
            .map_err(|e| format!("the keyspace is in layout 4, but the shards' `fold4` markers are left ({e}): they are harmless, DEL them by hand"))
    }

    async fn held_before(&self) -> RedisResult<i64> {
        let mut total = 0;
        for key in self.scan(&self.old("held:*")).await? {
            let n: i64 = self.cmd(redis::cmd("ZCARD").arg(key)).await?;
            total += n;
        }
        Ok(total)
    }

    async fn run(&mut self) -> RedisResult<()> {
        let held = self.held_before().await?;
        self.counters().await?;
        self.lives().await?;
        self.timers().await?;
        self.queues().await?;
        self.registry().await?;
        self.strays().await?;
        self.report.handed_back = held.max(0) as u64;
        self.clean_up().await
    }

    /// The runs stream goes to shard 0 (before anything is handed back there, which
    /// appends to it); every shard's claim counter starts past the old one, so that no
    /// claim number is used twice.
    async fn counters(&mut self) -> RedisResult<()> {
        let runs = self.store.shard(0).runs();
        let exists: bool = self.cmd(redis::cmd("EXISTS").arg(self.old("runs"))).await?;
        let taken: bool = self.cmd(redis::cmd("EXISTS").arg(&runs)).await?;
        if exists && !taken {
            let _: () = self
                .cmd(redis::cmd("RENAME").arg(self.old("runs")).arg(&runs))
                .await?;
        }
        let seq: Option<i64> = self
            .cmd(redis::cmd("GET").arg(self.old("claim_seq")))
            .await?;
        if let Some(seq) = seq {
            for shard in 0..self.store.shard_count() {
                let key = self.store.shard(shard).claim_seq();
                let current: Option<i64> = self.cmd(redis::cmd("GET").arg(&key)).await?;
                if current.unwrap_or(0) < seq {
                    let _: () = self.cmd(redis::cmd("SET").arg(&key).arg(seq)).await?;
                }
            }
        }
        Ok(())
    }

    async fn life(&mut self, uuid: &str) -> RedisResult<()> {
        let resource: Option<String> = self
            .cmd(
                redis::cmd("HGET")
                    .arg(self.old(&format!("life:{uuid}")))
                    .arg("resource_id"),
            )
            .await?;
        let placement = self.store.placement();
        let shard = placement.life(uuid, resource.as_deref());
        let home = placement.home(uuid);
        let extra = if home != shard {
            vec![
                self.store.shard(home).prefix.clone(),
                format!("{shard}:{}", chrono::Utc::now().timestamp_millis()),
            ]
        } else {
            vec![String::new(), String::new()]
        };
        if self.object(shard, "life", uuid, &extra).await? {
            self.report.lives += 1;
        }
        Ok(())
    }

    async fn lives(&mut self) -> RedisResult<()> {
        // Each Life moved leaves the old index, so its head is always what is left.
        for _ in 0..100_000_000 / BATCH {
            let members: Vec<String> = self
                .cmd(
                    redis::cmd("ZRANGE")
                        .arg(self.old("lives"))
                        .arg(0)
                        .arg(BATCH - 1),
                )
                .await?;
            if members.is_empty() {
                return Ok(());
            }
            for member in &members {
                let uuid = member.split_once(':').map(|(_, u)| u).unwrap_or(member);
                self.life(uuid).await?;
                // An index entry without its Life is dropped.
                let _: () = self
                    .cmd(redis::cmd("ZREM").arg(self.old("lives")).arg(member))
                    .await?;
            }
        }
        Ok(())
    }

    /// Layout 2 to 3: in every shard, each Life's Plan hashes (`plan:{uuid}:{kind}`)
    /// become fields of the Life's hash (`scripts/migrate.lua`, mode `fold`). The Lives
    /// are read from each shard's `lives` index a page at a time, and a page's Lives
    /// folded FOLD_IN_FLIGHT at a time (each in one script call of its own); a Life
    /// folded already has no Plan hash left and is passed over, so a run cut off is
    /// finished by the next.
    async fn fold_plans(&mut self) -> RedisResult<()> {
        for shard in 0..self.store.shard_count() {
            let lives = self.store.shard(shard).lives();
            for page in 0..100_000_000 / BATCH {
                let members: Vec<String> = self
                    .cmd(
                        redis::cmd("ZRANGE")
                            .arg(&lives)
                            .arg(page * BATCH)
                            .arg(page * BATCH + BATCH - 1),
                    )
                    .await?;
                let folded: Vec<bool> = futures_util::stream::iter(&members)
                    .map(|member| {
                        let uuid = member.split_once(':').map(|(_, u)| u).unwrap_or(member);
                        self.object(shard, "fold", uuid, &[])
                    })
                    .buffer_unordered(FOLD_IN_FLIGHT)
                    .try_collect()
                    .await?;
                self.report.folded_lives += folded.into_iter().filter(|f| *f).count() as u64;
                if (members.len() as isize) < BATCH {
                    break;
                }
            }
        }
        Ok(())
    }

    async fn timers(&mut self) -> RedisResult<()> {
        let names: Vec<String> = self
            .cmd(redis::cmd("ZRANGE").arg(self.old("timers")).arg(0).arg(-1))
            .await?;
        for name in names {
            let shard = self.store.placement().timer(&name);
            if self.object(shard, "timer", &name, &[]).await? {
                self.report.timers += 1;
            }
        }
        Ok(())
    }

    async fn queues(&mut self) -> RedisResult<()> {
        let names: Vec<String> = self
            .cmd(redis::cmd("ZRANGE").arg(self.old("queues")).arg(0).arg(-1))
            .await?;
        for name in names {
            let shard = self.store.placement().queue(&name);
            if self.object(shard, "queue", &name, &[]).await? {
                self.report.queues += 1;
            }
            self.tasks_of(&name, shard).await?;
        }
        // Tombstones of every task name still reserved, of queues gone too.
        for key in self.scan(&self.old("tombstone:*")).await? {
            let Some(id) = key.strip_prefix(&self.old("tombstone:")) else {
                continue;
            };
            let Some((queue, _)) = id.split_once('/') else {
                continue;
            };
            let shard = self.store.placement().queue(queue);
            if self.object(shard, "tombstone", id, &[]).await? {
                self.report.tombstones += 1;
            }
        }
        Ok(())
    }

    /// Every task of a queue whose indexes are in `shard` now.
    async fn tasks_of(&mut self, queue: &str, shard: u32) -> RedisResult<()> {
        let k = self.store.shard(shard);
        let mut names = BTreeSet::new();
        for index in ["tasks", "failed", "waiting"] {
            let members: Vec<String> = self
                .cmd(
                    redis::cmd("ZRANGE")
                        .arg(k.key_of(&format!("queue:{queue}:{index}")))
                        .arg(0)
                        .arg(-1),
                )
                .await?;
            for m in members {
                // `tasks` and `failed` hold task names; `waiting` holds Plan ids.
                let name = m
                    .strip_prefix(&format!("{queue}/"))
                    .and_then(|t| t.strip_suffix(":task"))
                    .map(str::to_string)
                    .unwrap_or(m);
                names.insert(name);
            }
        }
        let running: Vec<String> = self
            .cmd(redis::cmd("SMEMBERS").arg(k.queue_running(queue)))
            .await?;
        for member in running {
            // `{queue}/{task}:task#{claim}`
            let id = member.split('#').next().unwrap_or("");
            if let Some(name) = id
                .strip_prefix(&format!("{queue}/"))
                .and_then(|t| t.strip_suffix(":task"))
            {
                names.insert(name.to_string());
            }
        }
        for name in names {
            if self
                .object(shard, "task", &format!("{queue}/{name}"), &[])
                .await?
            {
                self.report.tasks += 1;
            }
        }
        Ok(())
    }

    /// The plugin registry's keys go under `{prefix}:{plugins}:`, one slot.
    async fn registry(&mut self) -> RedisResult<()> {
        let to = self.store.keys.registry();
        let mut keys = Vec::new();
        for pattern in [
            "plugins",
            "plugin:*",
            "wasm:*",
            "wasm-refs",
            "plugin-versions",
        ] {
            keys.extend(self.scan(&self.old(pattern)).await?);
        }
        for key in keys {
            let rest = &key[self.old.len()..];
            if rest.starts_with("plugin:") && rest.ends_with(":lives") {
                // The Lives booked with a plugin are indexed in their shards now.
                continue;
            }
            let _: () = self
                .cmd(redis::cmd("RENAME").arg(&key).arg(format!("{to}{rest}")))
                .await?;
            self.report.registry_keys += 1;
        }
        Ok(())
    }

    /// Lives and Plans no index named (written by a build with a bug, or half-deleted
    /// by hand) are moved too, so that nothing is left behind.
    async fn strays(&mut self) -> RedisResult<()> {
        for key in self.scan(&self.old("life:*")).await? {
            let uuid = key[self.old("life:").len()..].to_string();
            self.life(&uuid).await?;
        }
        for key in self.scan(&self.old("plan:*")).await? {
            let id = &key[self.old("plan:").len()..];
            if let Some(task) = id.strip_suffix(":task") {
                if let Some((queue, _)) = task.split_once('/') {
                    let shard = self.store.placement().queue(queue);
                    if self.object(shard, "task", task, &[]).await? {
                        self.report.tasks += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// What is left of the old layout is its emptied indexes and markers.
    async fn clean_up(&mut self) -> RedisResult<()> {
        let mut leftovers = Vec::new();
        for pattern in ["life:*", "plan:*", "timer:*", "queue:*"] {
            leftovers.extend(self.scan(&self.old(pattern)).await?);
        }
        if !leftovers.is_empty() {
            leftovers.truncate(10);
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "objects of the old layout could not be placed",
                leftovers.join(", "),
            )));
        }
        let mut doomed: Vec<String> = [
            "layout",
            "due",
            "due_tasks",
            "lives",
            "finished",
            "timers",
            "queues",
            "claim_seq",
            "runs",
        ]
        .iter()
        .map(|k| self.old(k))
        .collect();
        for pattern in ["held:*", "order:*", "resource:*", "plugin:*:lives"] {
            doomed.extend(self.scan(&self.old(pattern)).await?);
        }
        for key in doomed {
            let _: () = self.cmd(redis::cmd("DEL").arg(key)).await?;
        }
        Ok(())
    }
}
