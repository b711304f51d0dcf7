//! What `timers show|runs` and `queues show|tasks|failed` print for people: a timer's or
//! queue's summary in aligned lines, and its runs or tasks as a table, one line each
//! (errors cut to a line's width; `--output json` has them whole).

use serde_json::Value;

use super::print::{action_summary, runs_table, text, Table};

/// The longest error a table cell shows; the JSON has it whole.
const ERROR_CELL: usize = 60;

/// `label  value` lines, labels padded to one width; absent values left out.
struct Lines(Vec<(&'static str, String)>);

impl Lines {
    fn add(&mut self, label: &'static str, value: &Value) {
        if !value.is_null() {
            self.0.push((label, text(value)));
        }
    }

    fn add_text(&mut self, label: &'static str, value: String) {
        self.0.push((label, value));
    }

    fn render(&self) -> String {
        let width = self.0.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        self.0
            .iter()
            .map(|(label, value)| format!("{label:<width$}  {value}\n"))
            .collect()
    }
}

fn cut(s: String) -> String {
    match s.char_indices().nth(ERROR_CELL) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s,
    }
}

/// Seconds as the API gives them, with their unit.
fn seconds(value: &Value) -> String {
    match value.as_f64() {
        Some(s) => format!("{s} s"),
        None => text(value),
    }
}

/// `kairos timers show NAME`.
pub(super) fn timer(value: &Value) -> String {
    let mut l = Lines(Vec::new());
    l.add("timer", &value["name"]);
    l.add("state", &value["state"]);
    let mut schedule = text(&value["schedule"]);
    if let Some(tz) = value["timezone"].as_str() {
        schedule.push_str(&format!(" ({tz})"));
    }
    l.add_text("schedule", schedule);
    l.add("reads", &value["description"]);
    l.add("next run", &value["next_run"]);
    if let Some(outcome) = value["last_outcome"].as_str() {
        l.add_text("last run", outcome.to_string());
    }
    l.add_text("action", action_summary(&value["action"]));
    l.add("retries", &value["retries"]);
    if let Some(ms) = value["timeout_ms"].as_i64() {
        l.add_text("timeout", format!("{ms} ms"));
    }
    l.add("overlap", &value["overlap"]);
    l.add("misfire", &value["misfire"]);
    if !value["starting_deadline"].is_null() {
        l.add_text("deadline", seconds(&value["starting_deadline"]));
    }
    if let Some(dates) = value["exclude_dates"].as_array().filter(|d| !d.is_empty()) {
        let dates: Vec<String> = dates.iter().map(text).collect();
        l.add_text("excludes", dates.join(", "));
    }
    l.add("version", &value["version"]);
    l.add("created", &value["created_at"]);
    let mut out = l.render();
    if let Some(preview) = value["preview"].as_array() {
        out.push_str("\nnext runs:\n");
        for at in preview {
            out.push_str(&format!("  {}\n", text(at)));
        }
    }
    out
}

/// `kairos timers runs NAME`: the runs newest first.
pub(super) fn timer_runs(value: &Value) -> String {
    let runs = value["items"].as_array().cloned().unwrap_or_default();
    if runs.is_empty() {
        return format!("timer {} has no runs yet\n", text(&value["name"]));
    }
    let runs: Vec<Value> = runs
        .into_iter()
        .map(|mut r| {
            // Long errors are cut to keep one line a run.
            let cut_error = cut(text(&r["error"]));
            if r["error"].is_string() {
                r["error"] = Value::String(cut_error);
            }
            r
        })
        .collect();
    runs_table(
        &runs,
        &[("SLOT", "should_run_at"), ("STARTED", "started_at")],
    )
}

/// `kairos queues show NAME`.
pub(super) fn queue(value: &Value) -> String {
    let mut l = Lines(Vec::new());
    l.add("queue", &value["name"]);
    l.add("mode", &value["mode"]);
    l.add("state", &value["state"]);
    let tasks = &value["tasks"];
    let mut counts = format!("{} pending", text(&tasks["pending"]));
    for state in ["running", "leased"] {
        if !tasks[state].is_null() {
            counts.push_str(&format!(", {} {state}", text(&tasks[state])));
        }
    }
    counts.push_str(&format!(", {} failed", text(&tasks["failed"])));
    l.add_text("tasks", counts);
    match value["rate"].as_f64() {
        Some(r) if r > 0.0 => {
            let mut rate = format!("{r}/s, bucket {}", text(&value["bucket_size"]));
            if let Some(tokens) = value["bucket"]["tokens"].as_f64() {
                rate.push_str(&format!(" ({tokens:.1} tokens now)"));
            }
            l.add_text("rate", rate);
        }
        Some(_) => l.add_text("rate", "no limit".into()),
        None => {}
    }
    l.add("max concurrent", &value["max_concurrent"]);
    if let Some(key) = value["key"].as_str() {
        let mut per_key = key.to_string();
        if let Some(n) = value["max_concurrent_per_key"].as_i64() {
            per_key.push_str(&format!(", {n} at once"));
        }
        if let Some(r) = value["rate_per_key"].as_f64() {
            per_key.push_str(&format!(", {r}/s"));
        }
        l.add_text("per key", per_key);
    }
    let retry = &value["retry"];
    if retry.is_object() {
        let limit = match retry["limit"].as_i64() {
            Some(-1) => "no limit".to_string(),
            _ => format!("{} retries", text(&retry["limit"])),
        };
        let mut line = format!(
            "{limit}, backoff {}–{} doubling {} times",
            seconds(&retry["min_backoff"]),
            seconds(&retry["max_backoff"]),
            text(&retry["max_doublings"])
        );
        if !retry["age_limit"].is_null() {
            line.push_str(&format!(", for at most {}", seconds(&retry["age_limit"])));
        }
        l.add_text("retry", line);
    }
    l.add("created", &value["created_at"]);
    l.render()
}

/// `kairos queues tasks NAME` and `queues failed NAME`: one line a task.
pub(super) fn tasks(value: &Value) -> String {
    let items = value["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        return format!("no tasks in queue {}\n", text(&value["queue"]));
    }
    let failed = items.iter().any(|t| !t["failed_at"].is_null());
    let mut table = Table::new(&[
        "TASK",
        "STATE",
        if failed { "FAILED AT" } else { "ETA" },
        "ATTEMPTS",
        "LAST",
        "ACTION",
    ]);
    for t in &items {
        let last = match (t["last_status"].as_i64(), t["last_error"].as_str()) {
            (None, None) => "-".to_string(),
            (Some(s), None) => s.to_string(),
            (None, Some(e)) => cut(e.to_string()),
            (Some(s), Some(e)) => cut(format!("{s} {e}")),
        };
        let action = if t["action"].is_null() {
            t["tag"]
                .as_str()
                .map_or("-".into(), |tag| format!("tag {tag}"))
        } else {
            action_summary(&t["action"])
        };
        table.row(vec![
            text(&t["name"]),
            text(&t["state"]),
            text(if failed { &t["failed_at"] } else { &t["eta"] }),
            text(&t["attempts"]),
            last,
            action,
        ]);
    }
    table.render()
}

/// `kairos queues tasks show QUEUE TASK`.
pub(super) fn task(value: &Value) -> String {
    let mut l = Lines(Vec::new());
    l.add("task", &value["name"]);
    l.add("queue", &value["queue"]);
    l.add("state", &value["state"]);
    l.add("eta", &value["eta"]);
    l.add("expires", &value["expires_at"]);
    l.add("attempts", &value["attempts"]);
    l.add("last status", &value["last_status"]);
    l.add("last error", &value["last_error"]);
    l.add("failed at", &value["failed_at"]);
    if !value["action"].is_null() {
        l.add_text("action", action_summary(&value["action"]));
    }
    l.add("tag", &value["tag"]);
    l.add("lease until", &value["lease_expires_at"]);
    l.add("created", &value["created_at"]);
    let mut out = l.render();
    if !value["payload"].is_null() {
        out.push_str(&format!("payload      {}\n", value["payload"]));
    }
    // Its attempts (GET of one task), else its last run (a task of a list).
    let runs = match value["runs"].as_array() {
        Some(runs) => runs.clone(),
        None if value["last_run"].is_object() => vec![value["last_run"].clone()],
        None => Vec::new(),
    };
    if !runs.is_empty() {
        out.push_str("\nruns, newest first:\n");
        out.push_str(&runs_table(&runs, &[("STARTED", "started_at")]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_timer_reads_as_a_summary_and_its_runs_as_a_table() {
        let t = json!({
            "name": "nightly", "state": "Standby", "active": true, "schedule": "0 3 * * *",
            "timezone": "Europe/Paris", "description": "At 03:00", "next_run": "2030-01-02T03:00:00+01:00",
            "last_outcome": "failed", "action": {"method": "POST", "url": "http://x/run"},
            "retries": 2, "timeout_ms": 5000, "overlap": "skip", "starting_deadline": null,
            "preview": ["2030-01-02T03:00:00+01:00", "2030-01-03T03:00:00+01:00"]
        });
        let out = timer(&t);
        assert!(out.starts_with("timer     nightly\nstate     Standby\nschedule  0 3 * * * (Europe/Paris)\nreads     At 03:00\n"), "{out}");
        assert!(out.contains("action    POST http://x/run\n"), "{out}");
        assert!(out.contains("timeout   5000 ms\n"), "{out}");
        assert!(!out.contains("deadline"), "{out}");
        assert!(
            out.ends_with("next runs:\n  2030-01-02T03:00:00+01:00\n  2030-01-03T03:00:00+01:00\n"),
            "{out}"
        );

        let long = "x".repeat(200);
        let runs = json!({"name": "nightly", "items": [
            {"should_run_at": "S1", "started_at": "T1", "attempt": 1, "outcome": "failed",
             "status": 500, "duration_ms": 12, "host": "h1", "error": long},
            {"should_run_at": "S0", "outcome": "skipped", "skipped": 3, "reason": "late"}]});
        let out = timer_runs(&runs);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].starts_with("SLOT  STARTED  ATTEMPT  OUTCOME"),
            "{out}"
        );
        assert!(
            lines[1].contains("failed   500     12 ms     h1    "),
            "{out}"
        );
        assert!(
            lines[1].ends_with(&format!("{}…", "x".repeat(ERROR_CELL))),
            "{out}"
        );
        assert!(lines[2].ends_with("3 slot(s) skipped: late"), "{out}");
        assert_eq!(
            timer_runs(&json!({"name": "t", "items": []})),
            "timer t has no runs yet\n"
        );
    }

    #[test]
    fn a_queue_reads_as_a_summary_and_its_tasks_as_a_table() {
        let q = json!({
            "name": "mail", "mode": "push", "state": "Running", "rate": 5.0, "bucket_size": 10,
            "bucket": {"tokens": 7.3, "size": 10}, "max_concurrent": 2, "key": "/user",
            "max_concurrent_per_key": 1, "rate_per_key": null,
            "retry": {"limit": -1, "age_limit": 3600.0, "min_backoff": 0.1, "max_backoff": 60.0, "max_doublings": 16},
            "tasks": {"pending": 4, "running": 1, "leased": null, "failed": 12}
        });
        let out = queue(&q);
        assert!(
            out.contains("tasks           4 pending, 1 running, 12 failed\n"),
            "{out}"
        );
        assert!(
            out.contains("rate            5/s, bucket 10 (7.3 tokens now)\n"),
            "{out}"
        );
        assert!(out.contains("per key         /user, 1 at once\n"), "{out}");
        assert!(out.contains("retry           no limit, backoff 0.1 s–60 s doubling 16 times, for at most 3600 s\n"), "{out}");

        let failed = json!({"queue": "mail", "items": [
            {"name": "t1", "state": "Failed", "failed_at": "F1", "attempts": 3, "last_status": 503,
             "last_error": "Service Unavailable", "action": {"method": "POST", "path": "/send"}},
            {"name": "t2", "state": "Failed", "failed_at": "F2", "attempts": 1, "last_status": null,
             "last_error": "connect: refused", "action": {"plugin": "mailer@2"}}]});
        let out = tasks(&failed);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "TASK  STATE   FAILED AT  ATTEMPTS  LAST                     ACTION",
                "t1    Failed  F1         3         503 Service Unavailable  POST /send",
                "t2    Failed  F2         1         connect: refused         plugin mailer@2",
            ]
        );
        assert_eq!(
            tasks(&json!({"queue": "mail", "items": []})),
            "no tasks in queue mail\n"
        );
        let shown = json!({"queue": "q", "name": "t1", "state": "Failed", "attempts": 2,
            "runs": [{"started_at": "S2", "attempt": 2, "outcome": "failed", "status": 500, "duration_ms": 3, "host": "h", "error": "boom"},
                     {"started_at": "S1", "attempt": 1, "outcome": "retry", "status": 503, "duration_ms": 4, "host": "h"}]});
        let out = task(&shown);
        let runs: Vec<&str> = out
            .split("runs, newest first:\n")
            .nth(1)
            .unwrap()
            .lines()
            .collect();
        assert_eq!(runs.len(), 3, "{out}");
        assert!(runs[0].starts_with("STARTED  ATTEMPT  OUTCOME"), "{out}");
        assert!(
            runs[1].starts_with("S2       2        failed   500") && runs[1].ends_with("boom"),
            "{out}"
        );
        assert!(
            runs[2].starts_with("S1       1        retry    503"),
            "{out}"
        );
        let pending = json!({"queue": "q", "items": [{"name": "a", "state": "Pending", "eta": "E", "attempts": 0, "tag": "t"}]});
        assert!(tasks(&pending).starts_with("TASK  STATE    ETA  ATTEMPTS  LAST  ACTION\na     Pending  E    0         -     tag t\n"));
    }
}
