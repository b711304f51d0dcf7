//! A run in a Life's history, as a record keeps it (short, leaving out what the record
//! implies) and as the API shows it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One run in a Life's history (the API shows it with long names: [`RunEntry::view`]).
/// Stored as a [`RunWire`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RunWire")]
pub struct RunEntry {
    /// `b` (birth) or `d` (death).
    pub plan: String,
    pub attempt: u32,
    /// When it should have run, ms.
    pub should_run_at_ms: i64,
    /// When it started, ms.
    pub started_at_ms: i64,
    pub duration_ms: i64,
    pub host: String,
    /// `success`, `retry`, `failed`, `invalidated`, `interrupted`.
    pub outcome: String,
    pub status: Option<i64>,
    pub error: Option<String>,
    /// What a plugin returned, and its log lines.
    pub output: Option<Value>,
    pub logs: Vec<String>,
    pub retry_after_ms: Option<i64>,
}

/// `should_run_at_ms` of a run read without `at`: its Plan's time, which
/// [`LifeRecord::from_json`] puts in once the record is read.
pub(super) const AT_OF_PLAN: i64 = i64::MIN;

/// A run as a record stores it, short, since a finished Life keeps one or more for as
/// long as the history does: a run of the birth (`p` absent), of its first attempt (`n`
/// absent), that succeeded (`o` absent), due at its Plan's time (`at` absent: the
/// record's `b`, or `d` for a death), with its start as ms after that (`sd`). Records
/// written before kept `p`, `n`, `o` and `at` always and the start as epoch ms (`st`);
/// they read the same.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunWire<'a> {
    #[serde(
        rename = "p",
        default = "birth_word",
        skip_serializing_if = "is_birth_word"
    )]
    plan: std::borrow::Cow<'a, str>,
    #[serde(
        rename = "n",
        default = "first_attempt",
        skip_serializing_if = "is_first_attempt"
    )]
    attempt: u32,
    #[serde(rename = "at", default, skip_serializing_if = "Option::is_none")]
    should_run_at_ms: Option<i64>,
    /// Started at, epoch ms (records written before `sd`).
    #[serde(rename = "st", default, skip_serializing_if = "Option::is_none")]
    started_at_ms: Option<i64>,
    /// Started this many ms after it should have run.
    #[serde(rename = "sd", default, skip_serializing_if = "Option::is_none")]
    started_late_ms: Option<i64>,
    #[serde(rename = "ms")]
    duration_ms: i64,
    #[serde(rename = "h")]
    host: std::borrow::Cow<'a, str>,
    #[serde(
        rename = "o",
        default = "success_word",
        skip_serializing_if = "is_success_word"
    )]
    outcome: std::borrow::Cow<'a, str>,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    status: Option<i64>,
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    error: Option<std::borrow::Cow<'a, str>>,
    #[serde(rename = "out", default, skip_serializing_if = "Option::is_none")]
    output: Option<std::borrow::Cow<'a, Value>>,
    #[serde(rename = "log", default, skip_serializing_if = "<[_]>::is_empty")]
    logs: std::borrow::Cow<'a, [String]>,
    #[serde(rename = "ra", default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<i64>,
}

fn birth_word() -> std::borrow::Cow<'static, str> {
    "b".into()
}
fn is_birth_word(w: &str) -> bool {
    w == "b"
}
fn first_attempt() -> u32 {
    1
}
fn is_first_attempt(n: &u32) -> bool {
    *n == 1
}
fn success_word() -> std::borrow::Cow<'static, str> {
    "success".into()
}
fn is_success_word(w: &str) -> bool {
    w == "success"
}

impl TryFrom<RunWire<'_>> for RunEntry {
    type Error = &'static str;

    fn try_from(w: RunWire<'_>) -> Result<RunEntry, &'static str> {
        let (should_run_at_ms, started_at_ms) = match (w.should_run_at_ms, w.started_at_ms) {
            (Some(at), Some(started)) => (at, started),
            (Some(at), None) => (at, at + w.started_late_ms.unwrap_or(0)),
            // Its Plan's time, put in by from_json, which adds it to the delay kept here.
            (None, None) => (AT_OF_PLAN, w.started_late_ms.unwrap_or(0)),
            (None, Some(_)) => return Err("a run with `st` has `at` too"),
        };
        Ok(RunEntry {
            plan: w.plan.into_owned(),
            attempt: w.attempt,
            should_run_at_ms,
            started_at_ms,
            duration_ms: w.duration_ms,
            host: w.host.into_owned(),
            outcome: w.outcome.into_owned(),
            status: w.status,
            error: w.error.map(std::borrow::Cow::into_owned),
            output: w.output.map(std::borrow::Cow::into_owned),
            logs: w.logs.into_owned(),
            retry_after_ms: w.retry_after_ms,
        })
    }
}

impl RunEntry {
    pub(super) fn is_death(&self) -> bool {
        self.plan == "d"
    }

    /// This run as a record stores it, in a Life whose Plan is due at `plan_ms`
    /// ([`LifeRecord::own_ms`]).
    pub(super) fn wire(&self, plan_ms: Option<i64>) -> RunWire<'_> {
        RunWire {
            plan: self.plan.as_str().into(),
            attempt: self.attempt,
            should_run_at_ms: (plan_ms != Some(self.should_run_at_ms))
                .then_some(self.should_run_at_ms),
            started_at_ms: None,
            started_late_ms: Some(self.started_at_ms - self.should_run_at_ms),
            duration_ms: self.duration_ms,
            host: self.host.as_str().into(),
            outcome: self.outcome.as_str().into(),
            status: self.status,
            error: self.error.as_deref().map(Into::into),
            output: self.output.as_ref().map(std::borrow::Cow::Borrowed),
            logs: std::borrow::Cow::Borrowed(&self.logs),
            retry_after_ms: self.retry_after_ms,
        }
    }
}

impl RunEntry {
    pub(super) fn kind_word(&self) -> &'static str {
        if self.is_death() {
            "death"
        } else {
            "birth"
        }
    }

    /// The run as layout 3 kept it (and the API and the `runs` stream show it).
    pub fn view(&self) -> Value {
        let mut out = serde_json::json!({
            "plan": self.kind_word(),
            "attempt": self.attempt,
            "should_run_at": self.should_run_at_ms,
            "started_at": self.started_at_ms,
            "duration_ms": self.duration_ms,
            "host": self.host,
            "outcome": self.outcome,
        });
        if let Some(status) = self.status {
            out["status"] = status.into();
        }
        if let Some(error) = &self.error {
            out["error"] = error.as_str().into();
        }
        if let Some(output) = &self.output {
            out["output"] = output.clone();
        }
        if !self.logs.is_empty() {
            out["logs"] = serde_json::json!(self.logs);
        }
        if let Some(ms) = self.retry_after_ms {
            out["retry_after_ms"] = ms.into();
        }
        out
    }

    /// A run from its layout-3 JSON (`kairos migrate`).
    pub fn from_view(v: &Value) -> Option<RunEntry> {
        let plan = match v.get("plan")?.as_str()? {
            "death" => "d",
            _ => "b",
        };
        Some(RunEntry {
            plan: plan.into(),
            attempt: v.get("attempt")?.as_u64()? as u32,
            should_run_at_ms: v.get("should_run_at").and_then(Value::as_i64).unwrap_or(0),
            started_at_ms: v.get("started_at").and_then(Value::as_i64).unwrap_or(0),
            duration_ms: v.get("duration_ms").and_then(Value::as_i64).unwrap_or(0),
            host: v.get("host").and_then(Value::as_str).unwrap_or("").into(),
            outcome: v
                .get("outcome")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            status: v.get("status").and_then(Value::as_i64),
            error: v.get("error").and_then(Value::as_str).map(str::to_string),
            output: v.get("output").cloned(),
            logs: v
                .get("logs")
                .and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            retry_after_ms: v.get("retry_after_ms").and_then(Value::as_i64),
        })
    }
}
