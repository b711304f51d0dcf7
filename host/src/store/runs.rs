//! `kairos export-runs`: every run the shards' `runs` streams hold, as JSON lines, for
//! operators who keep full history elsewhere (a file, a log pipeline). The streams exist
//! only on hosts started with `--runs-stream-max-len N`; each keeps about the last N runs
//! of its shard (docs/redis-layout.md, `S:runs`).
//!
//! It reads; it never writes, and refuses a Redis that holds no kairos keyspace rather
//! than create one.

use std::io::Write;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Conn, Keys, ShardKeys, Target};

/// Entries read from one stream per call.
const BATCH: usize = 1_000;

/// How often `--follow` looks for new runs.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// The shards of the keyspace at `url` under `key_prefix`, read from its `meta`.
async fn open(url: &str, key_prefix: &str) -> Result<(Conn, Vec<ShardKeys>), String> {
    let target = Target::parse(url)?;
    let mut conn = Conn::open(&target)
        .await
        .map_err(|e| format!("cannot reach Redis at {url}: {e}"))?;
    let meta = Keys::new(key_prefix).meta();
    let shards: Option<u32> = redis::cmd("HGET")
        .arg(&meta)
        .arg("shards")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("cannot read `{meta}`: {e}"))?;
    let shards = shards.ok_or_else(|| {
        format!("no kairos keyspace here (`{meta}` has no `shards`): check --redis-url and --key-prefix")
    })?;
    let keys = (0..shards)
        .map(|i| ShardKeys::new(key_prefix, i, shards))
        .collect();
    Ok((conn, keys))
}

/// One stream entry as a JSON object: its shard and id, its fields (`life` and `plan`,
/// `timer`, or `queue` and `task`; `outcome`), and `record`, the run's JSON, parsed.
fn line(shard: u32, id: &str, fields: Vec<(String, String)>) -> Value {
    let mut object = Map::new();
    object.insert("shard".into(), Value::from(shard));
    object.insert("id".into(), Value::from(id));
    for (name, text) in fields {
        let value = match name.as_str() {
            "record" => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            _ => Value::String(text),
        };
        object.insert(name, value);
    }
    Value::Object(object)
}

/// The entries of `stream` after `after` (exclusive; `-`: from the first), at most
/// `BATCH`.
async fn read_after(
    conn: &mut Conn,
    stream: &str,
    after: &str,
) -> redis::RedisResult<Vec<(String, Vec<(String, String)>)>> {
    let start = if after == "-" {
        "-".to_string()
    } else {
        format!("({after}")
    };
    redis::cmd("XRANGE")
        .arg(stream)
        .arg(start)
        .arg("+")
        .arg("COUNT")
        .arg(BATCH)
        .query_async(conn)
        .await
}

/// Writes every run the streams hold to `out`, a JSON object a line, shard by shard;
/// with `follow`, then keeps writing new runs as they are recorded, until `out` is
/// closed or Redis fails. Returns how many lines it wrote.
pub async fn export(
    url: &str,
    key_prefix: &str,
    follow: bool,
    out: &mut dyn Write,
) -> Result<u64, String> {
    let (mut conn, shards) = open(url, key_prefix).await?;
    let mut last: Vec<String> = vec!["-".to_string(); shards.len()];
    let mut written = 0u64;
    loop {
        let mut quiet = true;
        for (shard, keys) in shards.iter().enumerate() {
            loop {
                let stream = keys.runs();
                let entries = read_after(&mut conn, &stream, &last[shard])
                    .await
                    .map_err(|e| format!("cannot read `{stream}`: {e}"))?;
                let full = entries.len() == BATCH;
                for (id, fields) in entries {
                    let text = line(keys.index, &id, fields).to_string();
                    if writeln!(out, "{text}").is_err() {
                        return Ok(written);
                    }
                    written += 1;
                    last[shard] = id;
                    quiet = false;
                }
                if !full {
                    break;
                }
            }
        }
        if out.flush().is_err() || !follow {
            return Ok(written);
        }
        if quiet {
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_the_shard_the_id_the_fields_and_the_record_as_json() {
        let fields = vec![
            ("life".to_string(), "abc".to_string()),
            ("outcome".to_string(), "success".to_string()),
            ("record".to_string(), r#"{"status":200}"#.to_string()),
        ];
        assert_eq!(
            line(3, "1-0", fields),
            serde_json::json!({"shard": 3, "id": "1-0", "life": "abc", "outcome": "success", "record": {"status": 200}})
        );
        let broken = vec![("record".to_string(), "not json".to_string())];
        assert_eq!(line(0, "2-0", broken)["record"], "not json");
    }
}
