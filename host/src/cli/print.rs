//! What the command-line client prints: the API's JSON (`--output json`, for scripts),
//! or for people a table, a Life's summary with its Plans and runs, or any other answer
//! as indented `key: value` lines.

use serde_json::Value;

/// `--output`: how answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// Tables and readable summaries.
    #[default]
    Table,
    /// The API's JSON, pretty-printed (one document per page for `ls --all`).
    Json,
}

pub(super) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Prints an answer that has no table of its own: JSON, or indented `key: value` lines.
pub(super) fn emit(output: Output, value: &Value) {
    match output {
        Output::Json => print_json(value),
        Output::Table => print!("{}", readable(value)),
    }
}

/// A scalar as a person reads it: strings without quotes, null as `-`.
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value, Value::Object(_) | Value::Array(_))
}

/// A JSON value as indented `key: value` lines (nulls left out; lists of scalars on one
/// line; objects and lists of objects nested).
pub(super) fn readable(value: &Value) -> String {
    let mut out = String::new();
    write_readable(&mut out, value, 0);
    out
}

fn write_readable(out: &mut String, value: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match v {
                    Value::Null => {}
                    Value::Object(m) if m.is_empty() => {}
                    Value::Array(items) if items.is_empty() => {
                        out.push_str(&format!("{pad}{key}: (none)\n"))
                    }
                    Value::Array(items) if items.iter().all(is_scalar) => {
                        let joined: Vec<String> = items.iter().map(text).collect();
                        out.push_str(&format!("{pad}{key}: {}\n", joined.join(", ")));
                    }
                    v if is_scalar(v) => out.push_str(&format!("{pad}{key}: {}\n", text(v))),
                    v => {
                        out.push_str(&format!("{pad}{key}:\n"));
                        write_readable(out, v, indent + 2);
                    }
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if is_scalar(item) {
                    out.push_str(&format!("{pad}- {}\n", text(item)));
                    continue;
                }
                // The item's first line carries the dash; the rest align under it.
                let nested = readable(item);
                for (i, line) in nested.lines().enumerate() {
                    let mark = if i == 0 { "- " } else { "  " };
                    out.push_str(&format!("{pad}{mark}{line}\n"));
                }
            }
        }
        scalar => out.push_str(&format!("{pad}{}\n", text(scalar))),
    }
}

/// Columns sized to their widest cell.
pub(super) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(super) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let last = cells.len().saturating_sub(1);
            let mut s = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i == last {
                    s.push_str(cell);
                } else {
                    s.push_str(&format!("{cell:<w$}  "));
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(self.headers.clone());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// `kairos show`: a Life's summary, its Plans, and its runs newest first.
pub(super) fn life(value: &Value) -> String {
    let mut out = String::new();
    let field = |k: &str| text(&value[k]);
    let mut kind = field("schedule_type");
    if let Some(resource) = value["resource_id"].as_str() {
        kind.push_str(&format!(", resource {resource}"));
    }
    out.push_str(&format!("life      {} ({kind})\n", field("life_uuid")));
    out.push_str(&format!("state     {}\n", field("state")));
    out.push_str(&format!("birth     {}\n", field("birth_time")));
    if !value["death_time"].is_null() {
        out.push_str(&format!("death     {}\n", field("death_time")));
    }
    for (key, label) in [("version", "version"), ("updated_at", "updated")] {
        if !value[key].is_null() {
            out.push_str(&format!("{label:<9} {}\n", field(key)));
        }
    }
    out.push('\n');
    let mut plans = Table::new(&[
        "PLAN", "STATE", "FIRE AT", "ATTEMPTS", "LAST", "HELD BY", "ACTION",
    ]);
    for p in value["plans"].as_array().into_iter().flatten() {
        let last = match (&p["last_status"], &p["last_error"]) {
            (Value::Null, Value::Null) => "-".to_string(),
            (status, Value::Null) => text(status),
            (Value::Null, error) => text(error),
            (status, error) => format!("{} {}", text(status), text(error)),
        };
        plans.row(vec![
            text(&p["kind"]),
            text(&p["state"]),
            text(&p["fire_at"]),
            text(&p["attempts"]),
            last,
            text(&p["held_by"]),
            action_summary(&p["action"]),
        ]);
    }
    out.push_str(&plans.render());
    let runs = value["history"].as_array().cloned().unwrap_or_default();
    if runs.is_empty() {
        out.push_str("\nno runs yet\n");
        return out;
    }
    out.push_str("\nruns, newest first:\n");
    out.push_str(&runs_table(
        &runs,
        &[("STARTED", "started_at"), ("PLAN", "plan")],
    ));
    out
}

/// Runs (of a Life, a timer or a queue task) as a table: the `lead` columns (heading,
/// field), then attempt, outcome, status, duration, host and error (for a timer's
/// skipped slots, how many and why).
pub(super) fn runs_table(runs: &[Value], lead: &[(&'static str, &str)]) -> String {
    let mut headings: Vec<&'static str> = lead.iter().map(|(h, _)| *h).collect();
    headings.extend(["ATTEMPT", "OUTCOME", "STATUS", "DURATION", "HOST", "ERROR"]);
    let mut table = Table::new(&headings);
    for r in runs {
        let error = match r["skipped"].as_i64() {
            Some(n) => format!("{n} slot(s) skipped: {}", text(&r["reason"])),
            None => text(&r["error"]),
        };
        let mut row: Vec<String> = lead.iter().map(|(_, field)| text(&r[*field])).collect();
        row.extend([
            text(&r["attempt"]),
            text(&r["outcome"]),
            text(&r["status"]),
            r["duration_ms"]
                .as_i64()
                .map_or("-".into(), |ms| format!("{ms} ms")),
            text(&r["host"]),
            error,
        ]);
        table.row(row);
    }
    table.render()
}

/// An action in a few words: `POST /hook`, `plugin chat-notify@2`.
pub(super) fn action_summary(action: &Value) -> String {
    if let Some(plugin) = action["plugin"].as_str() {
        return format!("plugin {plugin}");
    }
    let target = action["url"]
        .as_str()
        .or_else(|| action["path"].as_str())
        .unwrap_or("-");
    format!("{} {target}", action["method"].as_str().unwrap_or("POST"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_read_as_indented_lines() {
        let value = json!({
            "name": "mail", "paused": false, "rate": 2.5, "note": null,
            "hosts": ["a", "b"], "retry": {"limit": 3}, "empty": [],
            "items": [{"id": "t1", "state": "Standby"}, "plain"]
        });
        assert_eq!(
            readable(&value),
            "empty: (none)\nhosts: a, b\nitems:\n  - id: t1\n    state: Standby\n  - plain\nname: mail\npaused: false\nrate: 2.5\nretry:\n  limit: 3\n"
        );
    }

    #[test]
    fn tables_size_columns_to_their_cells() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        assert_eq!(t.render(), "A          LONGER\nwide cell  x\n");
    }

    #[test]
    fn a_life_shows_its_plans_and_runs() {
        let life = json!({
            "life_uuid": "l1", "schedule_type": "term", "resource_id": "r", "state": "Alive",
            "birth_time": "2030-01-01T00:00:00Z", "death_time": "2030-01-01T01:00:00Z",
            "plans": [{"kind": "birth", "state": "Done", "fire_at": "2030-01-01T00:00:00Z",
                       "attempts": 1, "last_status": 200, "last_error": null,
                       "action": {"method": "POST", "path": "/on"}}],
            "history": [{"started_at": "2030-01-01T00:00:00Z", "plan": "birth", "attempt": 1,
                         "outcome": "success", "status": 200, "duration_ms": 12, "host": "h1"}]
        });
        let text = life_text(&life);
        assert!(
            text.starts_with("life      l1 (term, resource r)\nstate     Alive\n"),
            "{text}"
        );
        assert!(
            text.contains("birth  Done   2030-01-01T00:00:00Z  1         200"),
            "{text}"
        );
        assert!(text.contains("POST /on"), "{text}");
        assert!(text.contains("success  200     12 ms     h1"), "{text}");
    }

    fn life_text(value: &Value) -> String {
        life(value)
    }
}
