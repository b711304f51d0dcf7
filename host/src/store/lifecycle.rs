//! A Life's state machine (SPEC section 1) as layout 4 keeps it: what a finished run, a
//! DELETE, a PATCH, a debounce merge or a run cut off by a crash makes of a Life's record,
//! and which index entries change with it. The store's scripts apply a [`Change`] all or
//! nothing, and only to the record it was computed from.
//!
//! Each edge is the one layout 3's scripts took (finish_run, cancel, patch, start_run's
//! invalidation, hand_back), so both layouts behave alike:
//! - a point's birth done: Dead; a term's: Alive, and its death joins the due tree (at
//!   once if a DELETE came in meanwhile);
//! - a death done: Dead; a death failing is retried, never failed for good;
//! - a birth failed for good, or retried after a DELETE came in: Stillbirth;
//! - a birth later than `birth_delay_limit_time`: Invalidated (a term's birth cut off by a
//!   crash before, which may have reached its target, leaves the Life Alive instead, and
//!   its death follows);
//! - a Plan that ends for good leaves its resource's order set.

use crate::model::{LifeState, NewLife, PlanKind};

use super::record::{Inflight, LifeRecord, PlanRecord, RunEntry};

/// What a change does besides writing the record: index entries, the census.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub record: LifeRecord,
    /// The Life's state before and after, when it moved.
    pub census: Option<(LifeState, LifeState)>,
    /// A Plan that joins the due tree, and when.
    pub due: Option<(String, i64)>,
    /// Plans that leave the resource's order set.
    pub order_leave: Vec<String>,
    /// The Life finished now: onto the finished list.
    pub finished: bool,
}

/// How a run ended, for its Life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Done,
    Retry {
        next_ms: i64,
    },
    Failed,
    /// A birth that came too late to run (`birth_delay_limit_time`).
    Invalidated,
}

fn state_of(rec: &LifeRecord) -> LifeState {
    rec.state.parse().unwrap_or(LifeState::Inexistent)
}

fn plan_id(uuid: &str, kind: PlanKind) -> String {
    format!("{uuid}:{}", kind.as_str())
}

impl Change {
    fn new(record: LifeRecord) -> Change {
        Change {
            record,
            census: None,
            due: None,
            order_leave: Vec::new(),
            finished: false,
        }
    }

    fn move_to(&mut self, to: LifeState) {
        let from = state_of(&self.record);
        if from != to {
            self.census = Some((from, to));
        }
        self.record.state = to.as_str().into();
    }

    /// The Life ends as `to` at `now_ms`.
    fn finish(&mut self, to: LifeState, now_ms: i64) {
        self.move_to(to);
        self.record.finished_ms = Some(now_ms);
        self.record.updated_ms = None;
        self.finished = true;
    }

    fn leave_order(&mut self, uuid: &str, kind: PlanKind) {
        if self.record.resource_id.is_some() {
            self.order_leave.push(plan_id(uuid, kind));
        }
    }

    fn set_plan_state(&mut self, kind: PlanKind, state: &str) {
        let plan = self.record.plan_mut(kind == PlanKind::Death);
        plan.state = Some(state.into());
        plan.fire_ms = None;
    }
}

/// What a finished run makes of its Life. `run` is the history entry (its outcome word
/// already set), `done_by` the `{host}#{claim}` mark of the run.
pub fn after_run(
    rec: &LifeRecord,
    uuid: &str,
    kind: PlanKind,
    ended: Ended,
    run: RunEntry,
    done_by: String,
    now_ms: i64,
) -> Change {
    let mut c = Change::new(rec.clone());
    let death = kind == PlanKind::Death;
    {
        let plan = c.record.plan_mut(death);
        plan.attempts = plan.attempts.max(run.attempt);
        if let Some(status) = run.status {
            plan.last_status = Some(status);
        }
        plan.last_error = run.error.clone();
    }
    c.record.push_run(run);
    c.record.done_by = Some(done_by);
    let term = rec.is_term();
    match (ended, kind) {
        (Ended::Retry { .. }, PlanKind::Birth) if rec.cancel_requested => {
            // Cancelled while this birth ran and it did not succeed: never start it again.
            c.set_plan_state(PlanKind::Birth, "Cancelled");
            c.leave_order(uuid, PlanKind::Birth);
            if term {
                c.set_plan_state(PlanKind::Death, "Cancelled");
                c.leave_order(uuid, PlanKind::Death);
            }
            c.finish(LifeState::Stillbirth, now_ms);
        }
        (Ended::Retry { next_ms }, _) => {
            c.record.plan_mut(death).fire_ms = Some(next_ms);
            c.record.updated_ms = Some(now_ms);
            c.due = Some((plan_id(uuid, kind), next_ms));
        }
        (Ended::Done, PlanKind::Birth) if term => {
            c.set_plan_state(PlanKind::Birth, "Done");
            c.leave_order(uuid, PlanKind::Birth);
            // Its death joins the due tree: at once if a DELETE came meanwhile.
            if rec.cancel_requested {
                c.record.death.fire_ms = Some(now_ms);
            }
            let death_at = c.record.fire_ms(true);
            c.move_to(LifeState::Alive);
            c.record.updated_ms = Some(now_ms);
            c.due = Some((plan_id(uuid, PlanKind::Death), death_at));
        }
        (Ended::Done, _) => {
            c.set_plan_state(kind, "Done");
            c.leave_order(uuid, kind);
            c.finish(LifeState::Dead, now_ms);
        }
        (Ended::Failed, PlanKind::Birth) => {
            c.set_plan_state(PlanKind::Birth, "Failed");
            c.leave_order(uuid, PlanKind::Birth);
            if term {
                c.set_plan_state(PlanKind::Death, "Cancelled");
                c.leave_order(uuid, PlanKind::Death);
            }
            c.finish(LifeState::Stillbirth, now_ms);
        }
        (Ended::Failed, PlanKind::Death) => {
            c.set_plan_state(PlanKind::Death, "Failed");
            c.leave_order(uuid, PlanKind::Death);
            c.finish(LifeState::Dead, now_ms);
        }
        (Ended::Invalidated, _) => {
            c.set_plan_state(PlanKind::Birth, "Invalidated");
            c.leave_order(uuid, PlanKind::Birth);
            if term && rec.birth.interrupted {
                // An attempt of this birth was cut off by a crash and may have reached its
                // target. Too late to run again, but the resource must not be left
                // activated: the Life counts as Alive and its death runs at its time.
                c.record.birth_uncertain = true;
                c.move_to(LifeState::Alive);
                c.record.updated_ms = Some(now_ms);
                c.due = Some((plan_id(uuid, PlanKind::Death), c.record.fire_ms(true)));
            } else {
                if term {
                    c.set_plan_state(PlanKind::Death, "Cancelled");
                    c.leave_order(uuid, PlanKind::Death);
                }
                c.finish(LifeState::Invalidated, now_ms);
            }
        }
    }
    c
}

/// The record of a Life booked now.
pub fn booked(life: &NewLife, now_ms: i64) -> LifeRecord {
    LifeRecord {
        state: LifeState::Inexistent.as_str().into(),
        birth_ms: life.birth_at_ms,
        death_ms: life.death_at_ms,
        resource_id: life.resource_id.clone(),
        created_ms: now_ms,
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
        birth_action: life.birth_action.clone(),
        death_action: life.death_action.clone(),
        runs: Vec::new(),
    }
}

/// Where a Plan is, from its record and its `inflight` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// In the due tree (or, a term's death before its birth is done, waiting for it).
    Standby,
    Preset,
    Running,
    /// It left for good (its record says how).
    Ended,
}

pub fn where_is(rec: &LifeRecord, kind: PlanKind, inflight: Option<&Inflight>) -> Where {
    let plan = rec.plan(kind == PlanKind::Death);
    match (&plan.state, inflight) {
        (Some(_), _) => Where::Ended,
        (None, Some(f)) if f.running.is_some() => Where::Running,
        (None, Some(_)) => Where::Preset,
        (None, None) => Where::Standby,
    }
}

/// Whether a term's death waits in the due tree (only once its Life is Alive).
fn death_is_due(rec: &LifeRecord) -> bool {
    state_of(rec) == LifeState::Alive
}

/// The index operations of one step, as `life_apply.lua` takes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ops(pub Vec<String>);

impl Ops {
    fn push(&mut self, words: &[&str]) {
        self.0.extend(words.iter().map(|w| w.to_string()));
    }

    /// Takes a Plan out of wherever it waits (the due tree at `fire_ms`, or a host's
    /// memory when Preset).
    fn take_out(&mut self, plan: &str, at: Where, fire_ms: i64) {
        match at {
            Where::Preset => self.push(&["infl-", plan]),
            Where::Standby => self.push(&["due-", plan, &fire_ms.to_string()]),
            _ => {}
        }
    }

    pub fn census(&mut self, from: Option<LifeState>, to: Option<LifeState>) {
        self.push(&[
            "census",
            from.map_or("-", LifeState::as_str),
            to.map_or("-", LifeState::as_str),
        ]);
    }
}

/// What a DELETE does.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancel {
    /// Changed: the record, the operations, and the Life's state now.
    Apply(Box<LifeRecord>, Ops, LifeState),
    /// The Life finished already, in this state.
    Finished(LifeState),
    /// A Plan of it runs and cannot be waited for (a point's birth, or `force`).
    Running,
}

pub fn cancel(
    rec: &LifeRecord,
    uuid: &str,
    inflight: [Option<&Inflight>; 2],
    force: bool,
    now_ms: i64,
) -> Cancel {
    let state = state_of(rec);
    if state.is_finished() {
        return Cancel::Finished(state);
    }
    let birth_at = where_is(rec, PlanKind::Birth, inflight[0]);
    let death_at = where_is(rec, PlanKind::Death, inflight[1]);
    let birth_id = plan_id(uuid, PlanKind::Birth);
    let death_id = plan_id(uuid, PlanKind::Death);
    let mut r = rec.clone();
    let mut ops = Ops::default();
    let ask_to_cancel = |r: &mut LifeRecord, ops: &mut Ops| {
        r.cancel_requested = true;
        r.updated_ms = Some(now_ms);
        ops.push(&["touch"]);
    };
    let end = |r: &mut LifeRecord, ops: &mut Ops, to: LifeState| {
        ops.census(Some(state), Some(to));
        r.state = to.as_str().into();
        r.finished_ms = Some(now_ms);
        r.updated_ms = None;
        ops.push(&["fin+", &now_ms.to_string()]);
    };
    let leave_order = |ops: &mut Ops, id: &str| {
        if let Some(rid) = &rec.resource_id {
            ops.push(&["order-", rid, id]);
        }
    };
    if state == LifeState::Inexistent {
        if birth_at == Where::Running {
            if rec.is_term() {
                // The birth is under way: let it finish, then run the death at once.
                ask_to_cancel(&mut r, &mut ops);
                return Cancel::Apply(Box::new(r), ops, LifeState::Inexistent);
            }
            return Cancel::Running;
        }
        ops.take_out(&birth_id, birth_at, rec.fire_ms(false));
        r.birth.state = Some("Cancelled".into());
        leave_order(&mut ops, &birth_id);
        if rec.is_term() {
            r.death.state = Some("Cancelled".into());
            leave_order(&mut ops, &death_id);
        }
        end(&mut r, &mut ops, LifeState::Stillbirth);
        return Cancel::Apply(Box::new(r), ops, LifeState::Stillbirth);
    }
    // Alive
    if death_at == Where::Running {
        if force {
            return Cancel::Running;
        }
        // The death is under way already; a failure retries it as usual.
        ask_to_cancel(&mut r, &mut ops);
        return Cancel::Apply(Box::new(r), ops, LifeState::Alive);
    }
    if force {
        ops.take_out(&death_id, death_at, rec.fire_ms(true));
        r.death.state = Some("Cancelled".into());
        r.death.fire_ms = None;
        leave_order(&mut ops, &death_id);
        end(&mut r, &mut ops, LifeState::Dead);
        return Cancel::Apply(Box::new(r), ops, LifeState::Dead);
    }
    r.cancel_requested = true;
    r.updated_ms = Some(now_ms);
    ops.take_out(&death_id, death_at, rec.fire_ms(true));
    r.death.fire_ms = Some(now_ms);
    ops.push(&["due+", &death_id, &now_ms.to_string()]);
    Cancel::Apply(Box::new(r), ops, LifeState::Alive)
}

/// Why a PATCH is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchRefusal {
    /// The Life changed since it was read (its version).
    Changed,
    /// A DELETE came in: the Life is on its way out.
    Cancelled,
    /// The Plan to change has started or ended.
    NotPending(PlanKind),
}

/// What a PATCH makes of a Life: `merged` is the booking as it will be. The operations
/// include the resource check (`conflict`), which `life_apply.lua` makes before it writes.
pub fn patch(
    rec: &LifeRecord,
    uuid: &str,
    inflight: [Option<&Inflight>; 2],
    expected_version: u64,
    merged: &NewLife,
    guard_ms: i64,
    now_ms: i64,
) -> Result<(LifeRecord, Ops), PatchRefusal> {
    if rec.version != expected_version {
        return Err(PatchRefusal::Changed);
    }
    if rec.cancel_requested {
        return Err(PatchRefusal::Cancelled);
    }
    let birth_changed =
        rec.birth_ms != merged.birth_at_ms || rec.birth_action != merged.birth_action;
    let death_changed =
        rec.death_ms != merged.death_at_ms || rec.death_action != merged.death_action;
    let resource_changed = rec.resource_id != merged.resource_id;
    let birth_at = where_is(rec, PlanKind::Birth, inflight[0]);
    let death_at = where_is(rec, PlanKind::Death, inflight[1]);
    let pending = |w: Where| matches!(w, Where::Standby | Where::Preset);
    let state = state_of(rec);
    if (birth_changed || resource_changed) && !(state == LifeState::Inexistent && pending(birth_at))
    {
        return Err(PatchRefusal::NotPending(PlanKind::Birth));
    }
    if death_changed && !pending(death_at) {
        return Err(PatchRefusal::NotPending(PlanKind::Death));
    }
    let birth_id = plan_id(uuid, PlanKind::Birth);
    let death_id = plan_id(uuid, PlanKind::Death);
    let mut r = rec.clone();
    let mut ops = Ops::default();
    if let Some(rid) = &merged.resource_id {
        ops.push(&[
            "conflict",
            rid,
            &(merged.birth_at_ms - guard_ms).to_string(),
            &(merged.end_at_ms() + guard_ms).to_string(),
        ]);
    }
    if birth_changed {
        ops.take_out(&birth_id, birth_at, rec.fire_ms(false));
        r.birth_ms = merged.birth_at_ms;
        r.birth_action = merged.birth_action.clone();
        r.birth.fire_ms = None;
        ops.push(&["due+", &birth_id, &merged.birth_at_ms.to_string()]);
        ops.push(&["lives-", &rec.birth_ms.to_string()]);
        ops.push(&["lives+", &merged.birth_at_ms.to_string()]);
    }
    if death_changed {
        r.death_ms = merged.death_at_ms;
        r.death_action = merged.death_action.clone();
        r.death.fire_ms = None;
        if death_is_due(rec) {
            // Only an Alive Life's death is in the due tree.
            ops.take_out(&death_id, death_at, rec.fire_ms(true));
            if let Some(d) = merged.death_at_ms {
                ops.push(&["due+", &death_id, &d.to_string()]);
            }
        }
    }
    // The resource's order set follows the Plans' new times (and resource).
    if let Some(old) = &rec.resource_id {
        ops.push(&["order-", old, &birth_id]);
        ops.push(&["order-", old, &death_id]);
    }
    if let Some(rid) = &merged.resource_id {
        if birth_at != Where::Ended {
            ops.push(&["order+", rid, &birth_id, &r.fire_ms(false).to_string()]);
        }
        if r.is_term() && death_at != Where::Ended {
            ops.push(&["order+", rid, &death_id, &r.fire_ms(true).to_string()]);
        }
    }
    if resource_changed || birth_changed {
        if let Some(old) = &rec.resource_id {
            ops.push(&["res-", old]);
        }
        if let Some(rid) = &merged.resource_id {
            ops.push(&["res+", rid, &merged.birth_at_ms.to_string()]);
        }
        r.resource_id = merged.resource_id.clone();
    }
    if birth_at == Where::Running || death_at == Where::Running {
        ops.push(&["touch"]);
    }
    r.version += 1;
    r.updated_ms = Some(now_ms);
    Ok((r, ops))
}

/// Whether a booking under a debounce key may merge into the Life holding the key's
/// window: it has not started (Inexistent, birth Standby or Preset, no DELETE pending).
pub fn debounce_open(rec: &LifeRecord, birth: Option<&Inflight>) -> bool {
    state_of(rec) == LifeState::Inexistent
        && !rec.cancel_requested
        && matches!(
            where_is(rec, PlanKind::Birth, birth),
            Where::Standby | Where::Preset
        )
}

/// The Life holding a debounce window after a booking merged into it: this booking's
/// action, fired at `fire_ms`.
pub fn debounce_merge(rec: &LifeRecord, life: &NewLife, fire_ms: i64, now_ms: i64) -> LifeRecord {
    let mut r = rec.clone();
    r.birth_action = life.birth_action.clone();
    r.birth_ms = fire_ms;
    r.birth.fire_ms = None;
    r.version += 1;
    r.debounced += 1;
    r.updated_ms = Some(now_ms);
    r
}

/// A run cut off by its host's crash (or lost lease), handed back by the shard's next
/// owner: recorded as interrupted (it may have reached its target), and its Plan due
/// again at its time.
pub fn interrupted(
    rec: &LifeRecord,
    kind: PlanKind,
    f: &Inflight,
    now_ms: i64,
) -> (LifeRecord, RunEntry) {
    let (started_ms, attempt) = f.running.unwrap_or((now_ms, 1));
    let err = format!(
        "host {} stopped (crashed or lost its lease) while this ran; it may have reached its target, and runs again",
        f.host
    );
    let run = RunEntry {
        plan: if kind == PlanKind::Death { "d" } else { "b" }.into(),
        attempt,
        should_run_at_ms: f.fire_ms,
        started_at_ms: started_ms,
        duration_ms: (now_ms - started_ms).max(0),
        host: f.host.clone(),
        outcome: "interrupted".into(),
        status: None,
        error: Some(err.clone()),
        output: None,
        logs: Vec::new(),
        retry_after_ms: None,
    };
    let mut r = rec.clone();
    let plan = r.plan_mut(kind == PlanKind::Death);
    plan.attempts = plan.attempts.max(attempt);
    plan.last_error = Some(err);
    plan.interrupted = true;
    r.push_run(run.clone());
    (r, run)
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
