//! Reading layout 4 from outside the host's scripts: where a Life's record is, a tree's
//! members in order. For `kairos where`, and for tests and tools that look inside Redis
//! (docs/redis-layout.md says how to do the same with redis-cli).

use redis::aio::ConnectionLike;

use super::record::{Inflight, LifeRecord};
use super::ShardKeys;

/// The first 32 bits of the SHA-1 of a Life's id: which record bucket holds it
/// (`record_bucket.lua`).
pub fn id_hash(uuid: &str) -> u32 {
    let digest = sha1_smol::Sha1::from(uuid.as_bytes()).digest().bytes();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The bucket of hash `h` among `n` buckets (linear hashing: `bucket_index` in
/// `record_bucket.lua`).
pub fn bucket_index(h: u32, n: u64) -> u64 {
    let n = n.max(1);
    let mut p = 1u64;
    while p * 2 <= n {
        p *= 2;
    }
    let b = u64::from(h) % (p * 2);
    if b >= n {
        u64::from(h) % p
    } else {
        b
    }
}

/// A script that reads a Life's record from its bucket, whatever the shard's number of
/// buckets (the math of `record_bucket.lua`): KEYS[1] the shard's `rn`, ARGV[1] the id.
const READ_RECORD: &str = "local n = tonumber(redis.call('GET', KEYS[1])) or 1 \
local h = tonumber(string.sub(redis.sha1hex(ARGV[1]), 1, 8), 16) local p = 1 \
while p * 2 <= n do p = p * 2 end local b = h % (p * 2) if b >= n then b = h % p end \
return redis.call('HGET', string.sub(KEYS[1], 1, -3) .. 'r:' .. b, ARGV[1])";

/// A script that prints a queue task whichever way it is stored: its record, from its
/// task bucket (a pending push task), or else its Plan hash. KEYS[1] the shard's `tn`,
/// KEYS[2] the Plan hash, ARGV[1] `{queue}/{task}`.
const READ_TASK: &str = "local n = tonumber(redis.call('GET', KEYS[1])) or 1 \
local h = tonumber(string.sub(redis.sha1hex(ARGV[1]), 1, 8), 16) local p = 1 \
while p * 2 <= n do p = p * 2 end local b = h % (p * 2) if b >= n then b = h % p end \
return redis.call('HGET', string.sub(KEYS[1], 1, -3) .. 't:' .. b, ARGV[1]) \
or redis.call('HGETALL', KEYS[2])";

/// The redis-cli command (its arguments after `redis-cli`) that prints task `task` of
/// `queue`, stored in shard `k`.
pub fn read_task_command(k: &ShardKeys, queue: &str, task: &str) -> String {
    format!(
        "EVAL \"{READ_TASK}\" 2 {} {} {}",
        shell_quote(&k.task_record_count()),
        shell_quote(&k.task_plan(queue, task)),
        shell_quote(&format!("{queue}/{task}"))
    )
}

/// `text` quoted for a POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The redis-cli command (its arguments after `redis-cli`) that prints Life `uuid`'s
/// record, stored in shard `k`.
pub fn read_life_command(k: &ShardKeys, uuid: &str) -> String {
    format!(
        "EVAL \"{READ_RECORD}\" 1 {} {}",
        shell_quote(&k.record_count()),
        shell_quote(uuid)
    )
}

/// A Life as stored in shard `k`: its record and its Plans' `inflight` entries; None
/// when the shard has no such Life.
pub async fn life<C: ConnectionLike>(
    conn: &mut C,
    k: &ShardKeys,
    uuid: &str,
) -> redis::RedisResult<Option<(LifeRecord, [Option<Inflight>; 2])>> {
    let n: Option<u64> = redis::cmd("GET")
        .arg(k.record_count())
        .query_async(conn)
        .await?;
    let bucket = bucket_index(id_hash(uuid), n.unwrap_or(1));
    let text: Option<String> = redis::cmd("HGET")
        .arg(k.records(bucket))
        .arg(uuid)
        .query_async(conn)
        .await?;
    let Some(text) = text else {
        return Ok(None);
    };
    let record = LifeRecord::from_json(&text).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::Client,
            "unreadable Life record",
            e.to_string(),
        ))
    })?;
    let (birth, death): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(k.inflight())
        .arg(format!("{uuid}:birth"))
        .arg(format!("{uuid}:death"))
        .query_async(conn)
        .await?;
    let parse = |v: Option<String>| v.as_deref().and_then(Inflight::parse);
    Ok(Some((record, [parse(birth), parse(death)])))
}

/// Every member of a tree (`due`, `lives`) with its score, in order.
pub async fn tree_members<C: ConnectionLike>(
    conn: &mut C,
    tree: &str,
) -> redis::RedisResult<Vec<(String, i64)>> {
    let entries: Vec<String> = redis::cmd("ZRANGE")
        .arg(tree)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let mut out = Vec::new();
    for entry in entries {
        let Some((_, leaf)) = entry.rsplit_once('|') else {
            continue;
        };
        let items: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(format!("{tree}:{leaf}"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await?;
        out.extend(items);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_one_at_a_time() {
        // With one bucket everything is in bucket 0; each split moves part of one
        // bucket only, to the new one.
        for h in [0u32, 1, 2, 3, 0xdead_beef, u32::MAX] {
            assert_eq!(bucket_index(h, 1), 0);
            for n in 1..40u64 {
                let (before, after) = (bucket_index(h, n), bucket_index(h, n + 1));
                assert!(before < n && after < n + 1);
                let mut p = 1;
                while p * 2 <= n {
                    p *= 2;
                }
                assert!(
                    after == before || (before == n - p && after == n),
                    "h {h} n {n}"
                );
            }
        }
    }

    #[test]
    fn the_hash_is_redis_sha1hex_first_8_digits() {
        // redis-cli EVAL "return redis.sha1hex(ARGV[1])" 0 abc → a9993e36...
        assert_eq!(id_hash("abc"), 0xa999_3e36);
    }
}
