//! Layout 4's Life record: a Life, its Plans and its history as one compact JSON value,
//! a field of one of its shard's record buckets (`{shard}:r:{n}`, docs/redis-layout.md).
//!
//! The host owns this format: it builds a Life's record when it books it and writes it
//! anew when a run ends or a person changes the Life, and the scripts store it as an
//! opaque string (checked against the text it replaces, so that no change is lost). A
//! script reads only the header, the scalars that come first in a fixed order
//! (`record_head` in common.lua): the Life's state, birth, death and resource.
//!
//! Names are short and times are epoch ms only, so that a pending booking costs little
//! more than its action: `{"b":1923577500000,"c":1764300000000,"a":{...}}` is a point
//! Life due at `b`, booked at `c`. The API renders a record exactly as layout 3's hash
//! was rendered ([`LifeRecord::hashes`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::Action;

/// The record format this build writes, `kairos:meta`'s `records`: 1 was layout 4's
/// first; 2 runs short ([`RunWire`]); 3 Plans leaving out what their Life implies
/// ([`PlanWire`]). A host raises `records` to its own when it opens the keyspace, and
/// refuses one of a later format, which it could not read.
pub const RECORD_FORMAT: u32 = 3;

/// Run records kept per Plan (the newest).
pub const RUNS_KEPT: usize = 50;

fn is_zero(n: &u64) -> bool {
    *n == 0
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn inexistent() -> String {
    "Inexistent".into()
}
fn is_inexistent(s: &String) -> bool {
    s == "Inexistent"
}

/// A Life as layout 4 stores it. Field order is the JSON's: the header first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifeRecord {
    /// The Life's state (absent: `Inexistent`).
    #[serde(
        rename = "s",
        default = "inexistent",
        skip_serializing_if = "is_inexistent"
    )]
    pub state: String,
    /// Birth time, ms.
    #[serde(rename = "b")]
    pub birth_ms: i64,
    /// Death time, ms (a term Life).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub death_ms: Option<i64>,
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<String>,
    /// Booked at, ms.
    #[serde(rename = "c")]
    pub created_ms: i64,
    /// Last changed at, ms (absent until the first change, and when it is `f`).
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub updated_ms: Option<i64>,
    /// Finished at, ms.
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<i64>,
    /// Bumped by each PATCH.
    #[serde(rename = "v", default, skip_serializing_if = "is_zero")]
    pub version: u64,
    /// A DELETE came while its birth ran (a term: the death runs at once after it).
    #[serde(rename = "cr", default, skip_serializing_if = "is_false")]
    pub cancel_requested: bool,
    /// A term whose birth was cut off by a crash, then too late to run again: its death
    /// still runs.
    #[serde(rename = "bu", default, skip_serializing_if = "is_false")]
    pub birth_uncertain: bool,
    /// The Plan whose outcome this (callback) Life reports.
    #[serde(rename = "cb", default, skip_serializing_if = "Option::is_none")]
    pub callback_of: Option<String>,
    /// The debounce key whose window this Life holds, and the bookings merged into it.
    #[serde(rename = "dk", default, skip_serializing_if = "Option::is_none")]
    pub debounce_key: Option<String>,
    #[serde(rename = "dn", default, skip_serializing_if = "is_zero")]
    pub debounced: u64,
    /// `{host}#{claim}` of the run whose outcome was written last: a finish retried after
    /// its reply was lost finds it and writes nothing twice.
    #[serde(rename = "db", default, skip_serializing_if = "Option::is_none")]
    pub done_by: Option<String>,
    /// The birth's and the death's Plan records, written by [`LifeRecord::to_json`]
    /// itself, after the actions, each leaving out what the Life implies ([`PlanWire`]).
    #[serde(
        rename = "B",
        default = "PlanRecord::left_out",
        skip_serializing,
        deserialize_with = "read_plan"
    )]
    pub birth: PlanRecord,
    #[serde(
        rename = "D",
        default = "PlanRecord::left_out",
        skip_serializing,
        deserialize_with = "read_plan"
    )]
    pub death: PlanRecord,
    /// The birth action.
    #[serde(rename = "a")]
    pub birth_action: Action,
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub death_action: Option<Action>,
    /// The runs, oldest first, the last [`RUNS_KEPT`] of each Plan. Written by
    /// [`LifeRecord::to_json`] itself, last, each run leaving out what the record implies
    /// ([`RunWire`]).
    #[serde(rename = "h", default, skip_serializing)]
    pub runs: Vec<RunEntry>,
}

/// What a Plan has been through, beyond what its Life says. Stored as a [`PlanWire`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanRecord {
    /// Its state once it left Standby for good (`Done`, `Failed`, `Invalidated`,
    /// `Cancelled`); None: Standby (or Preset, Running: the shard's `inflight` says).
    pub state: Option<String>,
    /// When it is due, when that is not its Life's time (a retry, a death moved to now).
    pub fire_ms: Option<i64>,
    /// Runs so far.
    pub attempts: u32,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    /// A run of it was cut off by its host's crash (it may have reached its target).
    pub interrupted: bool,
    /// What its stored form left out, until [`LifeRecord::from_json`] fills it in from
    /// the Life: nothing, once a record is read.
    left_out: LeftOut,
}

/// Fields of a [`PlanWire`] that were absent, so implied by the Life ([`Implied`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LeftOut {
    state: bool,
    attempts: bool,
    status: bool,
    error: bool,
}

impl PlanRecord {
    pub fn is_blank(&self) -> bool {
        *self == PlanRecord::default()
    }

    /// A Plan whose record was absent: everything its Life implies.
    fn left_out() -> PlanRecord {
        PlanRecord {
            left_out: LeftOut {
                state: true,
                attempts: true,
                status: true,
                error: true,
            },
            ..PlanRecord::default()
        }
    }

    /// This Plan as a record stores it, in a Life that implies `implied`: None when the
    /// Life implies all of it.
    fn wire(&self, implied: &Implied<'_>) -> Option<PlanWire<'_>> {
        let wire = PlanWire {
            state: (self.state.as_deref() != implied.state)
                .then(|| self.state.as_deref().map(Into::into)),
            fire_ms: self.fire_ms,
            attempts: (self.attempts != implied.attempts).then_some(self.attempts),
            last_status: (self.last_status != implied.status).then_some(self.last_status),
            last_error: (self.last_error.as_deref() != implied.error)
                .then(|| self.last_error.as_deref().map(Into::into)),
            interrupted: self.interrupted,
        };
        let empty = wire.state.is_none()
            && wire.fire_ms.is_none()
            && wire.attempts.is_none()
            && wire.last_status.is_none()
            && wire.last_error.is_none()
            && !wire.interrupted;
        (!empty).then_some(wire)
    }

    /// Fills in what the stored form left out.
    fn fill_in(&mut self, implied: &Implied<'_>) {
        let left_out = std::mem::take(&mut self.left_out);
        if left_out.state {
            self.state = implied.state.map(str::to_string);
        }
        if left_out.attempts {
            self.attempts = implied.attempts;
        }
        if left_out.status {
            self.last_status = implied.status;
        }
        if left_out.error {
            self.last_error = implied.error.map(str::to_string);
        }
    }
}

/// What a Life implies about one of its Plans, so that its record leaves it out: the
/// attempt, status and error of the Plan's last run (`after_run` copies them), and
/// `Done` for a Plan of a `Dead` Life.
struct Implied<'a> {
    state: Option<&'a str>,
    attempts: u32,
    status: Option<i64>,
    error: Option<&'a str>,
}

/// A Plan as a record stores it: each of `s`, `n`, `st` and `e` is absent when the Life
/// implies it ([`Implied`]), and written (`null` for none) when it does not. A Plan the
/// Life implies all of is absent. Records written before (2026-11-27) kept each that was
/// set; they read the same, since what they left out was what the Life implies.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanWire<'a> {
    #[serde(
        rename = "s",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    state: Option<Option<std::borrow::Cow<'a, str>>>,
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    fire_ms: Option<i64>,
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(
        rename = "st",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    last_status: Option<Option<i64>>,
    #[serde(
        rename = "e",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    last_error: Option<Option<std::borrow::Cow<'a, str>>>,
    #[serde(rename = "i", default, skip_serializing_if = "is_false")]
    interrupted: bool,
}

/// A field that is present, `null` or not: absent stays None (`default`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

fn read_plan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PlanRecord, D::Error> {
    let w = PlanWire::deserialize(d)?;
    Ok(PlanRecord {
        left_out: LeftOut {
            state: w.state.is_none(),
            attempts: w.attempts.is_none(),
            status: w.last_status.is_none(),
            error: w.last_error.is_none(),
        },
        state: w.state.flatten().map(std::borrow::Cow::into_owned),
        fire_ms: w.fire_ms,
        attempts: w.attempts.unwrap_or(0),
        last_status: w.last_status.flatten(),
        last_error: w.last_error.flatten().map(std::borrow::Cow::into_owned),
        interrupted: w.interrupted,
    })
}

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
const AT_OF_PLAN: i64 = i64::MIN;

/// A run as a record stores it, short, since a finished Life keeps one or more for as
/// long as the history does: a run of the birth (`p` absent), of its first attempt (`n`
/// absent), that succeeded (`o` absent), due at its Plan's time (`at` absent: the
/// record's `b`, or `d` for a death), with its start as ms after that (`sd`). Records
/// written before kept `p`, `n`, `o` and `at` always and the start as epoch ms (`st`);
/// they read the same.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunWire<'a> {
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
    fn is_death(&self) -> bool {
        self.plan == "d"
    }

    /// This run as a record stores it, in a Life whose Plan is due at `plan_ms`
    /// ([`LifeRecord::own_ms`]).
    fn wire(&self, plan_ms: Option<i64>) -> RunWire<'_> {
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
    fn kind_word(&self) -> &'static str {
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

/// A Plan claimed or running, as the shard's `inflight` hash says
/// (`{claim}|{fire_ms}|{host}` while Preset, `...|{started_ms}|{attempt}` once Running).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inflight {
    pub claim: String,
    pub fire_ms: i64,
    pub host: String,
    /// Set once it runs: (started at ms, attempt).
    pub running: Option<(i64, u32)>,
}

impl Inflight {
    pub fn parse(text: &str) -> Option<Inflight> {
        let mut parts = text.split('|');
        let claim = parts.next()?.to_string();
        let fire_ms = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_string();
        let running = match (parts.next(), parts.next()) {
            (Some(started), Some(attempt)) => Some((started.parse().ok()?, attempt.parse().ok()?)),
            _ => None,
        };
        Some(Inflight {
            claim,
            fire_ms,
            host,
            running,
        })
    }
}

type Hash = HashMap<String, String>;

impl LifeRecord {
    pub fn is_term(&self) -> bool {
        self.death_ms.is_some()
    }

    pub fn plan(&self, death: bool) -> &PlanRecord {
        if death {
            &self.death
        } else {
            &self.birth
        }
    }

    pub fn plan_mut(&mut self, death: bool) -> &mut PlanRecord {
        if death {
            &mut self.death
        } else {
            &mut self.birth
        }
    }

    /// When a Plan is due now (its own time, or its Life's).
    pub fn fire_ms(&self, death: bool) -> i64 {
        let own = self.own_ms(death).unwrap_or(self.birth_ms);
        self.plan(death).fire_ms.unwrap_or(own)
    }

    /// The Life's own time for a Plan: its birth time, or its death time (a term).
    fn own_ms(&self, death: bool) -> Option<i64> {
        if death {
            self.death_ms
        } else {
            Some(self.birth_ms)
        }
    }

    /// The action of a Plan.
    pub fn action(&self, death: bool) -> Option<&Action> {
        if death {
            self.death_action.as_ref()
        } else {
            Some(&self.birth_action)
        }
    }

    /// Adds a run to the history, keeping the last [`RUNS_KEPT`] of its Plan.
    pub fn push_run(&mut self, run: RunEntry) {
        let plan = run.plan.clone();
        self.runs.push(run);
        let of_plan = self.runs.iter().filter(|r| r.plan == plan).count();
        if of_plan > RUNS_KEPT {
            let mut drop = of_plan - RUNS_KEPT;
            self.runs.retain(|r| {
                if drop > 0 && r.plan == plan {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
    }

    /// What this Life implies about a Plan ([`Implied`]).
    fn implied(&self, death: bool) -> Implied<'_> {
        let last = self.runs.iter().rev().find(|r| r.is_death() == death);
        let exists = !death || self.is_term();
        Implied {
            state: (exists && self.state == "Dead").then_some("Done"),
            attempts: last.map_or(0, |r| r.attempt),
            status: last.and_then(|r| r.status),
            error: last.and_then(|r| r.error.as_deref()),
        }
    }

    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string(self).expect("a record serializes");
        // The Plans and the history go last, short (`PlanWire`, `RunWire`): they need
        // the Life's state, times and runs.
        text.pop();
        for (key, death) in [("B", false), ("D", true)] {
            if let Some(wire) = self.plan(death).wire(&self.implied(death)) {
                text.push_str(&format!(",\"{key}\":"));
                text.push_str(&serde_json::to_string(&wire).expect("a Plan serializes"));
            }
        }
        if !self.runs.is_empty() {
            let runs: Vec<RunWire<'_>> = self
                .runs
                .iter()
                .map(|r| r.wire(self.own_ms(r.is_death())))
                .collect();
            text.push_str(",\"h\":");
            text.push_str(&serde_json::to_string(&runs).expect("runs serialize"));
        }
        text.push('}');
        text
    }

    pub fn from_json(text: &str) -> Result<LifeRecord, serde_json::Error> {
        let mut record: LifeRecord = serde_json::from_str(text)?;
        let (birth_ms, death_ms) = (record.own_ms(false), record.own_ms(true));
        for run in &mut record.runs {
            if run.should_run_at_ms == AT_OF_PLAN {
                let Some(at) = (if run.is_death() { death_ms } else { birth_ms }) else {
                    return Err(serde::de::Error::custom(
                        "a death's run without `at` in a Life without a death time",
                    ));
                };
                run.should_run_at_ms = at;
                run.started_at_ms += at;
            }
        }
        for death in [false, true] {
            let mut plan = std::mem::take(record.plan_mut(death));
            plan.fill_in(&record.implied(death));
            *record.plan_mut(death) = plan;
        }
        Ok(record)
    }

    /// The Life, its birth and its death as layout 3's hashes held them, so that the API
    /// renders both layouts alike: `inflight` is each Plan's entry in the shard's
    /// `inflight` hash (Preset or Running), if any.
    pub fn hashes(&self, inflight: [Option<&Inflight>; 2]) -> (Hash, Hash, Hash) {
        let mut life = Hash::new();
        let put = |h: &mut Hash, k: &str, v: String| {
            h.insert(k.to_string(), v);
        };
        put(
            &mut life,
            "schedule_type",
            if self.is_term() { "term" } else { "point" }.into(),
        );
        put(&mut life, "state", self.state.clone());
        if let Some(rid) = &self.resource_id {
            put(&mut life, "resource_id", rid.clone());
        }
        put(&mut life, "birth_at_ms", self.birth_ms.to_string());
        if let Some(d) = self.death_ms {
            put(&mut life, "death_at_ms", d.to_string());
        }
        put(&mut life, "created_at_ms", self.created_ms.to_string());
        if let Some(u) = self.updated_ms.or(self.finished_ms) {
            put(&mut life, "updated_at_ms", u.to_string());
        }
        if let Some(f) = self.finished_ms {
            put(&mut life, "finished_at_ms", f.to_string());
        }
        if self.version > 0 {
            put(&mut life, "version", self.version.to_string());
        }
        if self.cancel_requested {
            put(&mut life, "cancel_requested", "1".into());
        }
        if self.birth_uncertain {
            put(&mut life, "birth_uncertain", "1".into());
        }
        if let Some(of) = &self.callback_of {
            put(&mut life, "callback_of", of.clone());
        }
        if let Some(key) = &self.debounce_key {
            put(&mut life, "debounce_key", key.clone());
            if self.debounced > 0 {
                put(&mut life, "debounced", self.debounced.to_string());
            }
        }
        if let Some((outcome, reason)) = super::outcome::Outcome::of(self) {
            put(&mut life, "outcome", outcome.as_str().into());
            if let Some(reason) = reason {
                put(&mut life, "outcome_reason", reason);
            }
        }
        for run in &self.runs {
            put(
                &mut life,
                &format!("run:{}:{}", run.kind_word(), run.attempt),
                run.view().to_string(),
            );
        }
        let plan_hash = |death: bool, inflight: Option<&Inflight>| {
            let p = self.plan(death);
            let mut h = Hash::new();
            let state = match (&p.state, inflight) {
                (Some(s), _) => s.clone(),
                (None, Some(f)) if f.running.is_some() => "Running".into(),
                (None, Some(_)) => "Preset".into(),
                (None, None) => "Standby".into(),
            };
            h.insert("state".into(), state);
            h.insert(
                "fire_at_ms".into(),
                inflight
                    .map(|f| f.fire_ms)
                    .unwrap_or_else(|| self.fire_ms(death))
                    .to_string(),
            );
            if p.attempts > 0 {
                h.insert("attempts".into(), p.attempts.to_string());
            }
            if let Some(s) = p.last_status {
                h.insert("last_status".into(), s.to_string());
            }
            if let Some(e) = &p.last_error {
                h.insert("last_error".into(), e.clone());
            }
            if p.interrupted {
                h.insert("interrupted".into(), "1".into());
            }
            if let Some(f) = inflight {
                h.insert("lease_owner".into(), f.host.clone());
                if let Some((started, _)) = f.running {
                    h.insert("started_at_ms".into(), started.to_string());
                }
            }
            if let Some(a) = self.action(death) {
                h.insert(
                    "action".into(),
                    serde_json::to_string(a).expect("actions serialize"),
                );
            }
            h
        };
        let birth = plan_hash(false, inflight[0]);
        let death = if self.is_term() {
            plan_hash(true, inflight[1])
        } else {
            Hash::new()
        };
        (life, birth, death)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending_point() -> LifeRecord {
        LifeRecord {
            state: inexistent(),
            birth_ms: 1_923_577_500_000,
            death_ms: None,
            resource_id: None,
            created_ms: 1_764_300_000_000,
            updated_ms: None,
            finished_ms: None,
            version: 0,
            cancel_requested: false,
            birth_uncertain: false,
            callback_of: None,
            debounce_key: None,
            debounced: 0,
            done_by: None,
            birth: PlanRecord::default(),
            death: PlanRecord::default(),
            birth_action: serde_json::from_value(
                serde_json::json!({"path": "/hook", "method": "POST", "body": {"n": 1}}),
            )
            .unwrap(),
            death_action: None,
            runs: Vec::new(),
        }
    }

    #[test]
    fn a_pending_point_life_is_its_time_its_booking_and_its_action() {
        let r = pending_point();
        let text = r.to_json();
        assert_eq!(
            text,
            r#"{"b":1923577500000,"c":1764300000000,"a":{"path":"/hook","method":"POST","body":{"n":1}}}"#
        );
        assert_eq!(LifeRecord::from_json(&text).unwrap(), r);
    }

    #[test]
    fn the_header_comes_first_in_a_fixed_order() {
        let mut r = pending_point();
        r.state = "Alive".into();
        r.death_ms = Some(1_923_577_600_000);
        r.resource_id = Some("conn-42".into());
        r.death_action = r.action(false).cloned();
        let text = r.to_json();
        assert!(
            text.starts_with(
                r#"{"s":"Alive","b":1923577500000,"d":1923577600000,"r":"conn-42","c":"#
            ),
            "{text}"
        );
    }

    #[test]
    fn history_keeps_the_last_runs_of_each_plan() {
        let mut r = pending_point();
        let run = |plan: &str, attempt: u32| RunEntry {
            plan: plan.into(),
            attempt,
            should_run_at_ms: 1,
            started_at_ms: attempt as i64,
            duration_ms: 1,
            host: "h".into(),
            outcome: "retry".into(),
            status: Some(503),
            error: None,
            output: None,
            logs: Vec::new(),
            retry_after_ms: None,
        };
        r.push_run(run("d", 1));
        for n in 1..=(RUNS_KEPT as u32 + 5) {
            r.push_run(run("b", n));
        }
        let births: Vec<u32> = r
            .runs
            .iter()
            .filter(|r| r.plan == "b")
            .map(|r| r.attempt)
            .collect();
        assert_eq!(births.len(), RUNS_KEPT);
        assert_eq!(births[0], 6);
        assert_eq!(r.runs.iter().filter(|r| r.plan == "d").count(), 1);
        let view = r.runs[0].view();
        assert_eq!(view["plan"], "death");
        assert_eq!(RunEntry::from_view(&view).unwrap(), r.runs[0]);
    }

    #[test]
    fn a_run_keeps_only_what_its_record_does_not_imply() {
        let mut r = pending_point();
        r.state = "Dead".into();
        let run = RunEntry {
            plan: "b".into(),
            attempt: 1,
            should_run_at_ms: r.birth_ms,
            started_at_ms: r.birth_ms + 5,
            duration_ms: 4,
            host: "vm-1".into(),
            outcome: "success".into(),
            status: Some(200),
            error: None,
            output: None,
            logs: Vec::new(),
            retry_after_ms: None,
        };
        r.push_run(run.clone());
        // A retry, due later than its Life's time.
        r.push_run(RunEntry {
            attempt: 2,
            should_run_at_ms: r.birth_ms + 1_000,
            started_at_ms: r.birth_ms + 998,
            outcome: "retry".into(),
            ..run.clone()
        });
        let text = r.to_json();
        assert!(
            text.ends_with(
                r#","h":[{"sd":5,"ms":4,"h":"vm-1","c":200},{"n":2,"at":1923577501000,"sd":-2,"ms":4,"h":"vm-1","o":"retry","c":200}]}"#
            ),
            "{text}"
        );
        assert_eq!(LifeRecord::from_json(&text).unwrap(), r);
        // A death's run is due at the record's `d`.
        r.death_ms = Some(r.birth_ms + 60_000);
        r.runs = vec![RunEntry {
            plan: "d".into(),
            should_run_at_ms: r.birth_ms + 60_000,
            started_at_ms: r.birth_ms + 60_001,
            ..run
        }];
        let text = r.to_json();
        assert!(
            text.ends_with(r#","h":[{"p":"d","sd":1,"ms":4,"h":"vm-1","c":200}]}"#),
            "{text}"
        );
        assert_eq!(LifeRecord::from_json(&text).unwrap(), r);
    }

    #[test]
    fn runs_written_in_full_before_read_the_same() {
        let text = r#"{"s":"Dead","b":1795793574000,"c":1795793572552,"f":1795793574009,"db":"vm-12085-0072#1","B":{"s":"Done","n":1,"st":200},"a":{"path":"/","method":"GET"},"h":[{"p":"b","n":1,"at":1795793574000,"st":1795793574005,"ms":4,"h":"vm-12085-0072","o":"success","c":200}]}"#;
        let r = LifeRecord::from_json(text).unwrap();
        assert_eq!(r.runs[0].should_run_at_ms, 1_795_793_574_000);
        assert_eq!(r.runs[0].started_at_ms, 1_795_793_574_005);
        assert_eq!(r.runs[0].outcome, "success");
        assert_eq!(r.birth.state.as_deref(), Some("Done"));
        assert_eq!((r.birth.attempts, r.birth.last_status), (1, Some(200)));
        // Written again, it leaves out what the Life implies, and reads the same.
        let again = r.to_json();
        assert_eq!(
            again,
            r#"{"s":"Dead","b":1795793574000,"c":1795793572552,"f":1795793574009,"db":"vm-12085-0072#1","a":{"path":"/","method":"GET"},"h":[{"sd":5,"ms":4,"h":"vm-12085-0072","c":200}]}"#
        );
        assert_eq!(LifeRecord::from_json(&again).unwrap(), r);
        // `st` without `at` is no run this code wrote.
        assert!(LifeRecord::from_json(&text.replace(r#""at":1795793574000,"#, "")).is_err());
    }

    #[test]
    fn a_plan_keeps_only_what_its_life_does_not_imply() {
        let run = |plan: &str, attempt, status: Option<i64>, error: Option<&str>| RunEntry {
            plan: plan.into(),
            attempt,
            should_run_at_ms: 1_923_577_500_000,
            started_at_ms: 1_923_577_500_005,
            duration_ms: 4,
            host: "vm-1".into(),
            outcome: "retry".into(),
            status,
            error: error.map(str::to_string),
            output: None,
            logs: Vec::new(),
            retry_after_ms: None,
        };
        let histories = [
            vec![],
            vec![run("b", 2, Some(503), Some("busy"))],
            vec![
                run("b", 1, Some(503), None),
                run("b", 2, None, Some("refused")),
            ],
            vec![
                run("b", 1, Some(200), None),
                run("d", 3, Some(500), Some("x")),
            ],
        ];
        let mut seen = 0;
        for state in ["Inexistent", "Alive", "Dead", "Stillbirth"] {
            for term in [false, true] {
                for history in &histories {
                    for plan_state in [None, Some("Done"), Some("Failed")] {
                        for attempts in [0, 1, 2, 3] {
                            for status in [None, Some(200), Some(503)] {
                                for error in [None, Some("busy"), Some("refused")] {
                                    let mut r = pending_point();
                                    r.state = state.into();
                                    if term {
                                        r.death_ms = Some(r.birth_ms + 60_000);
                                        r.death_action = r.action(false).cloned();
                                    }
                                    for h in history {
                                        let mut h = h.clone();
                                        if h.is_death() {
                                            h.should_run_at_ms += 60_000;
                                            h.started_at_ms += 60_000;
                                        }
                                        r.runs.push(h);
                                    }
                                    let plan = PlanRecord {
                                        state: plan_state.map(str::to_string),
                                        attempts,
                                        last_status: status,
                                        last_error: error.map(str::to_string),
                                        ..PlanRecord::default()
                                    };
                                    r.birth = plan.clone();
                                    if term {
                                        r.death = PlanRecord {
                                            fire_ms: Some(7),
                                            interrupted: true,
                                            ..plan
                                        };
                                    }
                                    let text = r.to_json();
                                    assert_eq!(LifeRecord::from_json(&text).unwrap(), r, "{text}");
                                    seen += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen, 4 * 2 * 4 * 3 * 4 * 3 * 3);
        // A Dead point Life whose birth succeeded at its first run keeps no Plan at all.
        let mut r = pending_point();
        r.state = "Dead".into();
        r.birth = PlanRecord {
            state: Some("Done".into()),
            attempts: 1,
            last_status: Some(200),
            ..PlanRecord::default()
        };
        r.runs.push(RunEntry {
            outcome: "success".into(),
            ..run("b", 1, Some(200), None)
        });
        let text = r.to_json();
        assert!(!text.contains(r#""B":"#), "{text}");
        // A run without a status keeps the Plan's older one, written out.
        r.runs.push(run("b", 2, None, Some("refused")));
        r.birth.attempts = 2;
        r.birth.last_error = Some("refused".into());
        let text = r.to_json();
        assert!(text.contains(r#","B":{"st":200},"h":"#), "{text}");
        assert_eq!(LifeRecord::from_json(&text).unwrap(), r);
    }

    #[test]
    fn inflight_entries_read_back() {
        assert_eq!(
            Inflight::parse("17|1000|h1"),
            Some(Inflight {
                claim: "17".into(),
                fire_ms: 1000,
                host: "h1".into(),
                running: None
            })
        );
        assert_eq!(
            Inflight::parse("17|1000|h1|1005|2").unwrap().running,
            Some((1005, 2))
        );
        assert_eq!(Inflight::parse("garbage"), None);
    }
}
