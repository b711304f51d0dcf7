//! Which host works which shard: live hosts announce themselves in `hosts`; each shard
//! has one owner at a time (`owner`: host, generation, lease deadline by Redis's clock),
//! taken with `shard_takeover`, kept with `shard_renew`, given up with `shard_release`.
//! The generation grows at every takeover; claim and start_run refuse a host whose
//! generation is not the shard's, so a host frozen past its lease and resumed cannot
//! claim or start anything its successor took over.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::Store;

/// Pages of a shard's `inflight` hash one audit reads at most (each about the audit's
/// batch of entries): a bound, far above what a shard holds in flight.
const MAX_INFLIGHT_PAGES: usize = 1_000;

/// What `shard_takeover` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takeover {
    /// The shard is this host's under generation `gen`; `previous` held it before ('' =
    /// nobody).
    Taken { gen: u64, previous: String },
    /// Another host holds a current lease on it.
    HeldBy(String),
}

/// A shard's owner as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardOwner {
    pub host: String,
    pub gen: u64,
    pub until_ms: i64,
}

impl Store {
    /// Records that `host` is alive until `until_ms`, and returns every host alive at
    /// `now_ms` (this one included), sorted.
    pub async fn announce_host(
        &self,
        host: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> redis::RedisResult<Vec<String>> {
        let key = self.keys.hosts();
        let mut conn = self.conn();
        let (mut live,): (Vec<String>,) = redis::pipe()
            .zadd(&key, host, until_ms)
            .ignore()
            // Hosts gone for a day are forgotten.
            .zrembyscore(&key, "-inf", now_ms - 86_400_000)
            .ignore()
            .zrangebyscore(&key, now_ms, "+inf")
            .query_async(&mut conn)
            .await?;
        live.sort();
        Ok(live)
    }

    /// Takes `host` off the live hosts (a graceful stop), so that the others take its
    /// shards at once rather than after its lease.
    pub async fn retire_host(&self, host: &str) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        conn.zrem(self.keys.hosts(), host).await
    }

    /// Until when `host` is known alive (ms), if it is listed.
    pub async fn host_alive_until(&self, host: &str) -> redis::RedisResult<Option<i64>> {
        let mut conn = self.conn();
        let score: Option<f64> = conn.zscore(self.keys.hosts(), host).await?;
        Ok(score.map(|s| s as i64))
    }

    /// Takes shard `shard` for `host` if nobody holds a current lease on it.
    pub async fn shard_takeover(
        &self,
        shard: u32,
        host: &str,
        lease_ms: i64,
    ) -> redis::RedisResult<Takeover> {
        let k = self.shard(shard);
        let (gen, other): (u64, String) = self
            .scripts
            .shard_takeover
            .key(k.owner())
            .arg(&k.prefix)
            .arg(host)
            .arg(lease_ms)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(if gen == 0 {
            Takeover::HeldBy(other)
        } else {
            Takeover::Taken {
                gen,
                previous: other,
            }
        })
    }

    /// Extends `host`'s lease on each of `shards` (shard, generation); per shard whether
    /// it is still this host's, or why it could not be asked within `patience`. All
    /// shards at once, one call each, each answer on its own: a master that does not
    /// answer fails the renewals of its shards only.
    pub async fn shard_renew(
        &self,
        host: &str,
        shards: &[(u32, u64)],
        lease_ms: i64,
        patience: std::time::Duration,
    ) -> Vec<redis::RedisResult<bool>> {
        let calls = shards.iter().map(|&(shard, gen)| {
            let k = self.shard(shard);
            let mut conn = self.conn();
            async move {
                let mut invocation = self.scripts.shard_renew.prepare_invoke();
                invocation
                    .key(k.owner())
                    .arg(&k.prefix)
                    .arg(host)
                    .arg(gen)
                    .arg(lease_ms);
                let renew = invocation.invoke_async::<i64>(&mut conn);
                match tokio::time::timeout(patience, renew).await {
                    Ok(kept) => kept.map(|kept| kept == 1),
                    Err(_) => Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no answer within a quarter lease",
                    ))),
                }
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// Puts up to `batch` Plans held in the shard back in its due sets; with `give_up`,
    /// also gives up the lease once none is left. A Life's run cut off is recorded as
    /// interrupted (`record_cut_off`). Returns (moved, left), left = -1 when `host` at
    /// `gen` no longer owns the shard.
    #[allow(clippy::too_many_arguments)]
    pub async fn shard_release(
        &self,
        shard: u32,
        host: &str,
        gen: u64,
        batch: usize,
        notify_before_ms: i64,
        give_up: bool,
        now_ms: i64,
    ) -> redis::RedisResult<(i64, i64)> {
        let k = self.shard(shard);
        let (moved, left, cut_off): (i64, i64, Vec<String>) = self
            .scripts
            .shard_release
            .key(k.owner())
            .key(k.held())
            .key(k.inflight())
            .key(k.due())
            .arg(&k.prefix)
            .arg(host)
            .arg(gen)
            .arg(batch)
            .arg(notify_before_ms)
            .arg(if give_up { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await?;
        let recorded = self
            .record_cut_off(shard, &cut_off, notify_before_ms, now_ms)
            .await?;
        // The runs just recorded are no longer left; the next call gives the lease up
        // when they were the last.
        Ok((moved + recorded, left))
    }

    /// A shard's owner as recorded (None: never owned).
    pub async fn shard_owner(&self, shard: u32) -> redis::RedisResult<Option<ShardOwner>> {
        let mut conn = self.conn();
        let h: HashMap<String, String> = conn.hgetall(self.shard(shard).owner()).await?;
        Ok((!h.is_empty()).then(|| ShardOwner {
            host: h.get("host").cloned().unwrap_or_default(),
            gen: h.get("gen").and_then(|g| g.parse().ok()).unwrap_or(0),
            until_ms: h.get("until").and_then(|u| u.parse().ok()).unwrap_or(0),
        }))
    }

    /// Every shard's owner as recorded, all shards at once.
    pub async fn shard_owners(&self) -> redis::RedisResult<Vec<Option<ShardOwner>>> {
        futures_util::future::try_join_all((0..self.shard_count()).map(|s| self.shard_owner(s)))
            .await
    }

    /// Plans `host` holds in a shard with a fire time before `before_ms` (at most about
    /// `limit`), each with its current claim number ('' when the Plan is gone): timers'
    /// and tasks' from `held`, Lives' from `inflight` (`scripts/inflight_scan.lua`).
    /// With `tracked_lives`, the Lives' Plans the caller tracks in the shard, `inflight`
    /// is read only when it holds more entries than that: a host that tracks every
    /// Plan it claimed costs the audit one HLEN, however many it holds.
    pub async fn held_due_before(
        &self,
        shard: u32,
        host: &str,
        before_ms: i64,
        limit: usize,
        tracked_lives: Option<usize>,
    ) -> redis::RedisResult<Vec<(String, String)>> {
        let k = self.shard(shard);
        let mut conn = self.conn();
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(k.held())
            .arg("-inf")
            .arg(before_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await?;
        let mut found = Vec::new();
        if !ids.is_empty() {
            let mut pipe = redis::pipe();
            for id in &ids {
                pipe.hget(k.plan(id), "claims");
            }
            let claims: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
            found.extend(
                ids.into_iter()
                    .zip(claims)
                    .map(|(id, claim)| (id, claim.unwrap_or_default())),
            );
        }
        if let Some(tracked) = tracked_lives {
            let entries: usize = redis::cmd("HLEN")
                .arg(k.inflight())
                .query_async(&mut conn)
                .await?;
            if entries <= tracked {
                return Ok(found);
            }
        }
        let mut cursor = "0".to_string();
        for _ in 0..MAX_INFLIGHT_PAGES {
            let (next, page): (String, Vec<String>) = self
                .scripts
                .inflight_scan
                .key(k.inflight())
                .arg(&k.prefix)
                .arg(host)
                .arg(before_ms)
                .arg(&cursor)
                .arg(limit)
                .invoke_async(&mut conn)
                .await?;
            found.extend(page.chunks_exact(2).map(|p| (p[0].clone(), p[1].clone())));
            if next == "0" || found.len() >= limit {
                break;
            }
            cursor = next;
        }
        Ok(found)
    }

    /// Hands named Plans held by `host` in a shard back to the due set, each only under
    /// the claim given with it (a Running one only if it started before
    /// `running_before_ms`; a Life's is recorded as interrupted); returns how many moved.
    pub async fn release(
        &self,
        shard: u32,
        host: &str,
        plans: &[(String, String)],
        notify_before_ms: i64,
        running_before_ms: i64,
        now_ms: i64,
    ) -> redis::RedisResult<i64> {
        let k = self.shard(shard);
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(k.held())
            .key(k.inflight())
            .key(k.due())
            .arg(&k.prefix)
            .arg(host)
            .arg(notify_before_ms)
            .arg(running_before_ms);
        for (id, claim) in plans {
            invocation.arg(id).arg(claim);
        }
        let (moved, cut_off): (i64, Vec<String>) =
            invocation.invoke_async(&mut self.conn()).await?;
        let recorded = self
            .record_cut_off(shard, &cut_off, notify_before_ms, now_ms)
            .await?;
        Ok(moved + recorded)
    }
}

/// The host that should work `shard` among `hosts` (rendezvous hashing: the highest
/// hash of host and shard wins), so that every host computes the same split from the
/// same list, and a host joining or leaving moves only its own share of shards.
pub fn preferred_host(shard: u32, hosts: &[String]) -> Option<&str> {
    hosts
        .iter()
        .max_by_key(|h| {
            // FNV-1a of the host, mixed with the shard by MurmurHash3's finalizer: host
            // names that differ in one letter still rank independently per shard.
            let mut x = super::shards::fnv1a(h.as_bytes())
                ^ (shard as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
            x ^ (x >> 33)
        })
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_evenly_and_move_little_when_a_host_joins() {
        let three: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let four: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let split = |hosts: &[String]| -> Vec<String> {
            (0..96)
                .map(|s| preferred_host(s, hosts).unwrap().to_string())
                .collect()
        };
        let before = split(&three);
        for h in &three {
            let n = before.iter().filter(|o| *o == h).count();
            assert!((20..=44).contains(&n), "{h} gets {n} of 96");
        }
        let after = split(&four);
        for (b, a) in before.iter().zip(&after) {
            assert!(a == b || a == "d", "a shard moved between two old hosts");
        }
        assert!(after.iter().any(|o| o == "d"));
        assert_eq!(preferred_host(0, &[]), None);
    }
}
