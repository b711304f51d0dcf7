//! `kairos timers check`: a schedule read and previewed here, without a server.

use anyhow::Context;
use serde_json::Value;

use super::print::print_json;
use crate::schedule::{Checked, Clock};

/// `kairos timers check`: the schedule's reading and next fire times, computed here.
pub(super) fn check_schedule(
    text: &str,
    zone: &str,
    from: Option<&str>,
    count: usize,
    json: bool,
) -> anyhow::Result<()> {
    let tz: chrono_tz::Tz = zone
        .parse()
        .map_err(|_| anyhow::anyhow!("`{zone}` is not an IANA time zone (e.g. Europe/London)"))?;
    let from_ms = match from {
        Some(text) => crate::bookings::request::parse_time(text, tz)
            .map_err(anyhow::Error::msg)?
            .timestamp_millis(),
        None => chrono::Utc::now().timestamp_millis(),
    };
    let checked = Checked::new(text, zone, from_ms, count).map_err(anyhow::Error::msg)?;
    if json {
        print_json(&crate::timers::checked_json(&checked));
        return Ok(());
    }
    println!("schedule     {}", text.trim());
    println!("description  {}", checked.description);
    println!("timezone     {}", checked.timezone.name());
    println!(
        "DST rule     {}",
        match checked.schedule.clock() {
            Clock::WallClock => "a fixed time of day: a slot in a spring gap runs once right after it, a repeated hour runs once",
            Clock::Elapsed => "elapsed time: runs through both copies of a repeated hour, not in a spring gap",
        }
    );
    println!("next fire times:");
    for ms in &checked.fires_ms {
        let at = chrono::DateTime::from_timestamp_millis(*ms).unwrap_or_default();
        println!(
            "  {}  ({})",
            at.with_timezone(&checked.timezone)
                .format("%a %Y-%m-%d %H:%M:%S %Z"),
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    Ok(())
}

/// `kairos timers check --batch`: many schedules at once, one JSON line each (used by
/// scripts/cron_oracle.py to compare fire times with an independent implementation).
pub(super) fn check_batch() -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in std::io::stdin().lock().lines() {
        let line = line.context("cannot read stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(case) => {
                let text = case["schedule"].as_str().unwrap_or_default();
                let zone = case["timezone"].as_str().unwrap_or("UTC");
                let from_ms = case["from_ms"].as_i64().unwrap_or(0);
                let count = case["count"].as_u64().unwrap_or(10).min(10_000) as usize;
                match Checked::new(text, zone, from_ms, count) {
                    Ok(c) => serde_json::json!({"fires": c.fires_ms}),
                    Err(e) => serde_json::json!({"error": e}),
                }
            }
            Err(e) => serde_json::json!({"error": format!("not a JSON line: {e}")}),
        };
        writeln!(out, "{answer}")?;
    }
    out.flush()?;
    Ok(())
}
