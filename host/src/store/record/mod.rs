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

use crate::model::Action;

mod run;
pub use run::RunEntry;
use run::{RunWire, AT_OF_PLAN};

/// The record format this build writes, `kairos:meta`'s `records`: 1 was layout 4's
/// first; 2 runs short ([`RunWire`]); 3 Plans leaving out what their Life implies
/// ([`PlanWire`]); 4 pending push queue tasks as records in task buckets, in the
/// `task_due` tree (task_records.lua), which an older host would not see. A host
/// raises `records` to its own when it opens the keyspace, and refuses one of a later
/// format, which it could not read.
pub const RECORD_FORMAT: u32 = 4;

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

    /// The Life's own fields as layout 3's hash held them, without its runs (for
    /// [`LifeRecord::hashes`], which adds them). A listing's summary reads the record
    /// itself (`life_views::life_summary`).
    fn life_hash(&self) -> Hash {
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
        life
    }

    /// The Life, its birth and its death as layout 3's hashes held them, so that the API
    /// renders both layouts alike: `inflight` is each Plan's entry in the shard's
    /// `inflight` hash (Preset or Running), if any.
    pub fn hashes(&self, inflight: [Option<&Inflight>; 2]) -> (Hash, Hash, Hash) {
        let mut life = self.life_hash();
        for run in &self.runs {
            life.insert(
                format!("run:{}:{}", run.kind_word(), run.attempt),
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
mod tests;
