//! What the store counts over every shard: the metrics' counts (`cluster_stats`), the
//! census, the failures of the last hour, a plugin's users, and the manual clock's next
//! step (`earliest_pending_ms`).

use std::collections::HashMap;

use redis::AsyncCommands;

use super::{life_id_number, Store};
use crate::error::ApiError;

/// What `scripts/shard_stats.lua` answers of one shard: due, due tasks, finished,
/// overdue, overdue tasks, when the first due Plan is due.
type ShardCounts = (i64, i64, i64, i64, i64, String);

/// Members of a shard's `plugin-lives:{name}` set (SSCAN's COUNT), or timers, one
/// `plugin_users` call reads: a few hundred microseconds of Redis at a time.
pub const PLUGIN_USERS_PAGE: usize = 1_000;
/// The most pages `plugin_users` reads of a shard's Lives, or of its timers: ten million.
const MAX_PLUGIN_USERS_PAGES: usize = 10_000;

/// The current minute of the machine's clock, since the epoch.
pub(crate) fn now_minute() -> i64 {
    chrono::Utc::now().timestamp() / 60
}

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

impl Store {
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

    /// A shard's census: Lives per state (and `v`), counted afresh first when it is not
    /// marked yet.
    pub(crate) async fn census_of(&self, shard: u32) -> redis::RedisResult<HashMap<String, i64>> {
        let census: HashMap<String, i64> = self.conn().hgetall(self.shard(shard).census()).await?;
        if census.contains_key("v") {
            Ok(census)
        } else {
            self.census_rebuild(shard).await
        }
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

    /// [`earliest_pending_ms`](Self::earliest_pending_ms) of each shard that has one
    /// (`scripts/shard_first.lua`).
    pub async fn earliest_pending_by_shard(
        &self,
        after_ms: Option<i64>,
    ) -> redis::RedisResult<Vec<(u32, i64)>> {
        let after = after_ms.map(|ms| ms.to_string()).unwrap_or_default();
        let firsts = (0..self.shard_count()).map(|shard| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            let after = after.clone();
            let script = &self.scripts.shard_first;
            async move {
                let first: String = script
                    .key(k.due())
                    .key(k.timers_due())
                    .key(k.due_tasks())
                    .key(k.held())
                    .key(k.inflight())
                    .arg(&k.prefix)
                    .arg(after)
                    .invoke_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((shard, first.parse::<f64>().ok().map(|f| f as i64)))
            }
        });
        Ok(futures_util::future::try_join_all(firsts)
            .await?
            .into_iter()
            .filter_map(|(shard, first)| Some((shard, first?)))
            .collect())
    }

    pub async fn cluster_stats(&self, now_ms: i64) -> redis::RedisResult<ClusterStats> {
        let counts = (0..self.shard_count()).map(|shard| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            let script = &self.scripts.shard_stats;
            async move {
                let (due, tasks, finished, overdue, overdue_tasks, first): ShardCounts = script
                    .key(k.due())
                    .key(k.timers_due())
                    .key(k.due_tasks())
                    .key(k.finished())
                    .arg(&k.prefix)
                    .arg(now_ms)
                    .invoke_async(&mut conn)
                    .await?;
                let census: HashMap<String, i64> = conn.hgetall(k.census()).await?;
                Ok::<_, redis::RedisError>((
                    due,
                    tasks,
                    finished,
                    overdue,
                    overdue_tasks,
                    first,
                    census,
                ))
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
            if let Ok(at) = first.parse::<f64>() {
                if (at as i64) <= now_ms {
                    stats.oldest_overdue_ms = stats.oldest_overdue_ms.max(now_ms - at as i64);
                }
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
}
