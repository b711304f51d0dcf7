//! `kairos slowlog`: Redis's slow log (`SLOWLOG GET`) with kairos's scripts named. Redis
//! logs a script call as `EVALSHA {sha1} …`; this build knows the SHA-1 of each of its
//! scripts (`script_names_by_hash`), so an operator sees `finish_life` or `claim` and how
//! much of the logged time each took, instead of hashes.
//!
//! It reads; it never writes (the slow log is not reset, its threshold not changed).

use std::collections::HashMap;
use std::io::Write;

use redis::Value;

use super::Target;

/// One call Redis logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowCall {
    /// When it ran (Unix seconds).
    pub at_s: i64,
    /// How long it ran, in µs.
    pub micros: u64,
    /// What it was: the script's name (`finish_life`), `EVALSHA {sha1}` for a script
    /// this build does not know (another version's), or the command (`HGETALL`).
    pub what: String,
    /// Its arguments, as Redis counted them before it cut the list short: the words
    /// after the command (a script's: after its SHA-1, the key count included).
    pub args: usize,
}

/// One node's slow log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLog {
    /// The node's address, without a password the URL may carry.
    pub node: String,
    /// `slowlog-log-slower-than`, µs (negative: the log is off); None where `CONFIG`
    /// is refused (a managed Redis that renames or forbids it).
    pub threshold_us: Option<i64>,
    pub calls: Vec<SlowCall>,
}

/// Reads the last `count` entries of each node's slow log: the one server of a
/// `redis://` URL, or each node a `redis+cluster://` URL names.
pub async fn read(url: &str, count: usize) -> Result<Vec<NodeLog>, String> {
    let names = super::script_names_by_hash();
    let mut logs = Vec::new();
    for url in Target::parse(url)?.nodes() {
        let node = without_password(&url);
        let client = redis::Client::open(url.as_str())
            .map_err(|e| format!("`{node}` is not a Redis URL: {e}"))?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("cannot reach Redis at {node}: {e}"))?;
        let entries: Value = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(count)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("cannot read the slow log of {node}: {e}"))?;
        let threshold: Option<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("slowlog-log-slower-than")
            .query_async(&mut conn)
            .await
            .ok();
        logs.push(NodeLog {
            node,
            threshold_us: threshold.and_then(|t| t.get(1)?.parse().ok()),
            calls: parse_entries(&entries, &names),
        });
    }
    Ok(logs)
}

/// A node's URL without the user and password it may carry, to print.
fn without_password(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://{host}"),
        _ => url.to_string(),
    }
}

/// The entries of a `SLOWLOG GET` reply: `[id, unix time, µs, [argv…], client, name]`
/// each; an entry of another shape is skipped.
pub fn parse_entries(reply: &Value, names: &HashMap<String, &'static str>) -> Vec<SlowCall> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            let at_s: i64 = redis::from_redis_value_ref(fields.get(1)?).ok()?;
            let micros: u64 = redis::from_redis_value_ref(fields.get(2)?).ok()?;
            // Bytes, not strings: a key that is not UTF-8 must not drop the entry.
            let argv: Vec<Vec<u8>> = redis::from_redis_value_ref(fields.get(3)?).ok()?;
            let argv: Vec<String> = argv
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let (what, named_by) = describe(&argv, names);
            Some(SlowCall {
                at_s,
                micros,
                what,
                args: words(&argv).saturating_sub(named_by),
            })
        })
        .collect()
}

/// The words of a logged command: Redis keeps at most 32, the last one saying how many
/// more there were (`... (1021 more arguments)`).
fn words(argv: &[String]) -> usize {
    let more = argv
        .last()
        .and_then(|last| last.strip_prefix("... ("))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok());
    match more {
        Some(n) => argv.len() - 1 + n,
        None => argv.len(),
    }
}

/// What a logged command was, and how many of its first words name it (a script's
/// command and its SHA-1 or body; any other command's name): the rest are its arguments.
fn describe(argv: &[String], names: &HashMap<String, &'static str>) -> (String, usize) {
    let command = argv
        .first()
        .map(|c| c.to_ascii_uppercase())
        .unwrap_or_default();
    match (command.as_str(), argv.get(1)) {
        ("EVALSHA" | "EVALSHA_RO", Some(sha)) => {
            let what = match names.get(&sha.to_ascii_lowercase()) {
                Some(name) => (*name).to_string(),
                None => format!("{command} {} (not a script of this build)", short(sha)),
            };
            (what, 2)
        }
        ("EVAL" | "EVAL_RO", Some(_)) => (format!("{command} (a script sent whole)"), 2),
        _ => (command, 1),
    }
}

/// The first 12 characters of a SHA-1, as much as a person compares.
fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// Prints each node's log, newest first, then the logged time by what ran, most first.
pub fn print(logs: &[NodeLog], out: &mut dyn Write) -> std::io::Result<()> {
    for log in logs {
        let threshold = log
            .threshold_us
            .map_or_else(|| "not readable".to_string(), |us| format!("{us} µs"));
        writeln!(
            out,
            "# {}: {} calls logged (slowlog-log-slower-than {threshold})",
            log.node,
            log.calls.len(),
        )?;
        if log.calls.is_empty() {
            writeln!(
                out,
                "#   none: to log kairos's script calls, lower the threshold, e.g. \
                 `redis-cli CONFIG SET slowlog-log-slower-than 1000` (µs)"
            )?;
            continue;
        }
        for call in &log.calls {
            let at = chrono::DateTime::from_timestamp(call.at_s, 0)
                .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_else(|| call.at_s.to_string());
            writeln!(
                out,
                "{at} {:>9} µs {:>6} args  {}",
                call.micros, call.args, call.what
            )?;
        }
        writeln!(out, "# by what ran:  calls  µs in all  µs a call  what")?;
        for (what, calls, micros) in totals(&log.calls) {
            writeln!(
                out,
                "{:>22} {micros:>9} {:>10}  {what}",
                calls,
                micros / calls as u64
            )?;
        }
    }
    Ok(())
}

/// Calls and µs by what ran, most time first.
pub fn totals(calls: &[SlowCall]) -> Vec<(String, usize, u64)> {
    let mut by: HashMap<&str, (usize, u64)> = HashMap::new();
    for call in calls {
        let e = by.entry(call.what.as_str()).or_default();
        e.0 += 1;
        e.1 += call.micros;
    }
    let mut out: Vec<(String, usize, u64)> = by
        .into_iter()
        .map(|(what, (n, us))| (what.to_string(), n, us))
        .collect();
    out.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(at: i64, us: i64, argv: &[&str]) -> Value {
        Value::Array(vec![
            Value::Int(1),
            Value::Int(at),
            Value::Int(us),
            Value::Array(argv.iter().map(|a| bulk(a)).collect()),
            bulk("127.0.0.1:5000"),
            bulk(""),
        ])
    }

    #[test]
    fn a_script_call_is_named_and_its_arguments_counted() {
        let names = crate::store::script_names_by_hash();
        let (sha, _) = names.iter().find(|(_, n)| **n == "finish_life").unwrap();
        let mut argv = vec!["EVALSHA", sha.as_str(), "1", "k"];
        argv.extend(["a"; 27]);
        argv.push("... (993 more arguments)");
        let reply = Value::Array(vec![
            entry(1_764_000_000, 4_200, &argv),
            entry(1_764_000_001, 900, &["EVALSHA", &"0".repeat(40), "0"]),
            entry(1_764_000_002, 50, &["HGETALL", "kairos:meta"]),
        ]);
        let calls = parse_entries(&reply, &names);
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].what, "finish_life");
        assert_eq!(calls[0].micros, 4_200);
        // The SHA-1 is not an argument; the key count, the key and 1,020 more are.
        assert_eq!(calls[0].args, 1 + 1 + 27 + 993);
        assert!(
            calls[1].what.contains("not a script of this build"),
            "{:?}",
            calls[1]
        );
        assert_eq!(calls[2].what, "HGETALL");
        assert_eq!(calls[2].args, 1);

        let mut text = Vec::new();
        print(
            &[NodeLog {
                node: "redis://127.0.0.1:6379".into(),
                threshold_us: Some(0),
                calls,
            }],
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("2025-11-24T16:00:00Z      4200 µs   1022 args  finish_life"),
            "{text}"
        );
        let by = text.split("# by what ran").nth(1).unwrap();
        assert!(
            by.find("finish_life").unwrap() < by.find("HGETALL").unwrap(),
            "{text}"
        );
    }

    #[test]
    fn a_password_in_the_url_is_not_printed() {
        assert_eq!(
            without_password("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://10.0.0.1:6379/0"
        );
        assert_eq!(
            without_password("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn an_empty_log_says_how_to_fill_it() {
        let mut text = Vec::new();
        print(
            &[NodeLog {
                node: "n".into(),
                threshold_us: Some(10_000),
                calls: Vec::new(),
            }],
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("CONFIG SET slowlog-log-slower-than"),
            "{text}"
        );
    }
}
