//! How full Redis is, and what it does when it is full.
//!
//! A Redis that reaches `maxmemory` either evicts keys (any policy but `noeviction`:
//! pending bookings and resource locks vanish without a word) or refuses writes. kairos
//! refuses to start on an evicting policy (unless told otherwise), and keeps its own
//! headroom below `maxmemory`: the supervisor reads `INFO memory` of each shard's Redis
//! and records here how full it is; past `SHED_AT` the shard's owner deletes the oldest
//! finished Lives before their retention, and past `REFUSE_AT` new bookings into that
//! shard are answered 507 `storage_full`, so that runs under way can still record their
//! outcomes and nothing pending is ever lost.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use redis::{InfoDict, RedisResult};

use super::Store;
use crate::error::ApiError;

/// From this share of `maxmemory` (in thousandths), owners shed history early.
pub const SHED_AT: u32 = 900;
/// From this share of `maxmemory` (in thousandths), new bookings are refused.
pub const REFUSE_AT: u32 = 950;

/// What `INFO memory` (and `INFO persistence`) said of one Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisMemory {
    pub used: u64,
    /// `maxmemory`; 0 when it has no limit.
    pub max: u64,
    pub policy: String,
}

impl RedisMemory {
    fn from_info(info: &InfoDict) -> RedisMemory {
        RedisMemory {
            used: info.get("used_memory").unwrap_or(0),
            max: info.get("maxmemory").unwrap_or(0),
            policy: info
                .get("maxmemory_policy")
                .unwrap_or_else(|| "unknown".to_string()),
        }
    }

    /// How full it is, in thousandths of `maxmemory` (0 without a limit).
    pub fn permille(&self) -> u32 {
        if self.max == 0 {
            return 0;
        }
        ((self.used as u128 * 1000) / self.max as u128).min(u32::MAX as u128) as u32
    }

    /// Whether Redis may delete keys on its own when full.
    pub fn may_evict(&self) -> bool {
        self.policy != "noeviction"
    }
}

/// How full each shard's Redis was at the last look; shared by the store (which refuses
/// bookings) and the supervisor (which looks and sheds).
#[derive(Debug, Default)]
pub struct MemoryState {
    permille: Vec<AtomicU32>,
    /// The fullest shard's Redis at the last look, for metrics.
    used: AtomicU64,
    max: AtomicU64,
    policy: Mutex<String>,
    /// Bookings refused for want of room.
    pub refused: AtomicU64,
    /// Finished Lives deleted before their retention for want of room.
    pub shed: AtomicU64,
    /// As read at startup.
    durability: Mutex<Option<Durability>>,
}

impl MemoryState {
    pub fn new(shards: u32) -> MemoryState {
        MemoryState {
            permille: (0..shards).map(|_| AtomicU32::new(0)).collect(),
            ..MemoryState::default()
        }
    }

    /// Records a look at every shard's Redis (`seen[i]` for shard `i`).
    pub fn record(&self, seen: &[RedisMemory]) {
        for (slot, m) in self.permille.iter().zip(seen) {
            slot.store(m.permille(), Ordering::Relaxed);
        }
        if let Some(fullest) = seen.iter().max_by_key(|m| m.permille()) {
            self.used.store(fullest.used, Ordering::Relaxed);
            self.max.store(fullest.max, Ordering::Relaxed);
            *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = fullest.policy.clone();
        }
    }

    /// How full a shard's Redis was at the last look, in thousandths of `maxmemory`.
    pub fn permille(&self, shard: u32) -> u32 {
        self.permille
            .get(shard as usize)
            .map_or(0, |p| p.load(Ordering::Relaxed))
    }

    /// The fullest shard's Redis: used bytes, `maxmemory` (0: none) and policy.
    pub fn fullest(&self) -> (u64, u64, String) {
        (
            self.used.load(Ordering::Relaxed),
            self.max.load(Ordering::Relaxed),
            self.policy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    pub fn set_durability(&self, durability: Durability) {
        *self.durability.lock().unwrap_or_else(|p| p.into_inner()) = Some(durability);
    }

    /// An info metric: the policy, `appendonly` and `appendfsync` Redis runs with.
    pub fn info_metric(&self) -> String {
        let (_, _, policy) = self.fullest();
        let d = self
            .durability
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or(Durability {
                appendonly: "unknown".into(),
                appendfsync: "unknown".into(),
            });
        let clean = |s: &str| s.replace(['"', '\\', '\n'], "_");
        format!(
            "# HELP kairos_redis_info How Redis keeps data: maxmemory-policy, appendonly, appendfsync (read at startup; the policy every second).\n# TYPE kairos_redis_info gauge\nkairos_redis_info{{maxmemory_policy=\"{}\",appendonly=\"{}\",appendfsync=\"{}\"}} 1\n",
            clean(&policy),
            clean(&d.appendonly),
            clean(&d.appendfsync)
        )
    }

    /// Refuses a new booking into `shard` when its Redis is nearly full.
    pub fn check_room(&self, shard: u32) -> Result<(), ApiError> {
        let permille = self.permille(shard);
        if permille < REFUSE_AT {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(ApiError::storage_full(format!(
            "Redis is {}.{}% full (maxmemory); new bookings are refused until runs finish or history is shed; nothing already booked is lost",
            permille / 10,
            permille % 10
        )))
    }
}

/// How a Redis keeps what it acknowledged, as read at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// `appendonly`: `yes` or `no`.
    pub appendonly: String,
    /// `appendfsync` (`always`, `everysec`, `no`), or `unknown` where CONFIG is refused.
    pub appendfsync: String,
}

impl Store {
    /// Reads `INFO memory` of every shard's Redis (one call on a single server).
    pub async fn read_memory(&self) -> RedisResult<Vec<RedisMemory>> {
        let mut conn = self.conn();
        if !self.target().is_cluster() {
            let info: InfoDict = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await?;
            let m = RedisMemory::from_info(&info);
            return Ok(vec![m; self.shard_count() as usize]);
        }
        let mut seen = Vec::with_capacity(self.shard_count() as usize);
        for shard in 0..self.shard_count() {
            let mut cmd = redis::cmd("INFO");
            cmd.arg("memory");
            let reply = conn.on_slot(self.shard(shard).slot() as u16, cmd).await?;
            let info: InfoDict = redis::from_redis_value(reply)?;
            seen.push(RedisMemory::from_info(&info));
        }
        Ok(seen)
    }

    /// `hash-max-listpack-value` of the Redis of shard 0: the longest value a hash may
    /// hold and keep its compact encoding. None where CONFIG is refused.
    pub async fn listpack_value_limit(&self) -> Option<u64> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("hash-max-listpack-value");
        let reply = conn.on_slot(self.shard(0).slot() as u16, cmd).await.ok()?;
        let pair: Vec<String> = redis::from_redis_value(reply).ok()?;
        pair.get(1)?.parse().ok()
    }

    /// `appendonly` and `appendfsync` of the Redis of shard 0.
    pub async fn durability(&self) -> RedisResult<Durability> {
        let mut conn = self.conn();
        let slot = self.shard(0).slot() as u16;
        let mut cmd = redis::cmd("INFO");
        cmd.arg("persistence");
        let info: InfoDict = redis::from_redis_value(conn.on_slot(slot, cmd).await?)?;
        let aof: i64 = info.get("aof_enabled").unwrap_or(0);
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("appendfsync");
        // Hosted Redis often refuses CONFIG; say so rather than guess.
        let appendfsync = match conn.on_slot(slot, cmd).await {
            Ok(value) => redis::from_redis_value::<Vec<String>>(value)
                .ok()
                .and_then(|pair| pair.get(1).cloned())
                .unwrap_or_else(|| "unknown".into()),
            Err(_) => "unknown".into(),
        };
        Ok(Durability {
            appendonly: if aof == 1 { "yes" } else { "no" }.into(),
            appendfsync,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(used: u64, max: u64) -> RedisMemory {
        RedisMemory {
            used,
            max,
            policy: "noeviction".into(),
        }
    }

    #[test]
    fn fullness_is_a_share_of_maxmemory_and_nothing_without_one() {
        assert_eq!(mem(900, 1000).permille(), 900);
        assert_eq!(mem(5_000, 0).permille(), 0);
        assert_eq!(mem(u64::MAX, 1).permille(), u32::MAX);
    }

    #[test]
    fn bookings_are_refused_only_in_shards_whose_redis_is_nearly_full() {
        let state = MemoryState::new(2);
        state.record(&[mem(949, 1000), mem(950, 1000)]);
        assert!(state.check_room(0).is_ok());
        let refused = state.check_room(1).unwrap_err();
        assert_eq!(refused.status.as_u16(), 507);
        assert_eq!(refused.code, "storage_full");
        assert_eq!(state.refused.load(Ordering::Relaxed), 1);
        assert_eq!(state.fullest().0, 950);
    }

    #[test]
    fn every_policy_but_noeviction_may_evict() {
        for policy in [
            "allkeys-lru",
            "volatile-ttl",
            "allkeys-random",
            "volatile-lfu",
        ] {
            let m = RedisMemory {
                policy: policy.into(),
                ..mem(0, 0)
            };
            assert!(m.may_evict(), "{policy}");
        }
        assert!(!mem(0, 0).may_evict());
    }
}
