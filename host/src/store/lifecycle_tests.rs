//! Unit tests of `lifecycle.rs`: each change of a Life as the host decides it.

use super::*;
use crate::model::{Action, ScheduleType};

fn action(path: &str) -> Action {
    serde_json::from_value(serde_json::json!({"path": path, "method": "POST"})).unwrap()
}

fn life(term: bool, rid: Option<&str>) -> NewLife {
    NewLife {
        life_uuid: "u".into(),
        schedule_type: if term {
            ScheduleType::Term
        } else {
            ScheduleType::Point
        },
        resource_id: rid.map(str::to_string),
        birth_at_ms: 1_000,
        death_at_ms: term.then_some(5_000),
        birth_action: action("/b"),
        death_action: term.then(|| action("/d")),
    }
}

fn run(plan: &str, attempt: u32, outcome: &str) -> RunEntry {
    RunEntry {
        plan: plan.into(),
        attempt,
        should_run_at_ms: 1_000,
        started_at_ms: 1_001,
        duration_ms: 5,
        host: "h".into(),
        outcome: outcome.into(),
        status: Some(200),
        error: None,
        output: None,
        logs: Vec::new(),
        retry_after_ms: None,
    }
}

#[test]
fn a_point_birth_done_ends_the_life_dead() {
    let rec = booked(&life(false, Some("r")), 10);
    let c = after_run(
        &rec,
        "u",
        PlanKind::Birth,
        Ended::Done,
        run("b", 1, "success"),
        "h#1".into(),
        2_000,
    );
    assert_eq!(c.record.state, "Dead");
    assert_eq!(c.census, Some((LifeState::Inexistent, LifeState::Dead)));
    assert!(c.finished);
    assert_eq!(c.order_leave, ["u:birth"]);
    assert_eq!(c.record.birth.state.as_deref(), Some("Done"));
    assert_eq!(c.record.birth.attempts, 1);
    assert_eq!(c.record.finished_ms, Some(2_000));
    assert_eq!(c.record.done_by.as_deref(), Some("h#1"));
    assert_eq!(c.due, None);
}

#[test]
fn a_term_birth_done_makes_the_life_alive_and_its_death_due() {
    let rec = booked(&life(true, None), 10);
    let c = after_run(
        &rec,
        "u",
        PlanKind::Birth,
        Ended::Done,
        run("b", 1, "success"),
        "h#1".into(),
        2_000,
    );
    assert_eq!(c.record.state, "Alive");
    assert_eq!(c.due, Some(("u:death".into(), 5_000)));
    assert!(!c.finished);
    // A DELETE that came while the birth ran: the death at once.
    let mut asked = rec.clone();
    asked.cancel_requested = true;
    let c = after_run(
        &asked,
        "u",
        PlanKind::Birth,
        Ended::Done,
        run("b", 1, "success"),
        "h#1".into(),
        2_000,
    );
    assert_eq!(c.due, Some(("u:death".into(), 2_000)));
}

#[test]
fn a_retry_goes_back_to_the_due_tree_unless_a_cancel_came() {
    let rec = booked(&life(true, Some("r")), 10);
    let c = after_run(
        &rec,
        "u",
        PlanKind::Birth,
        Ended::Retry { next_ms: 3_000 },
        run("b", 1, "retry"),
        "h#1".into(),
        2_000,
    );
    assert_eq!(c.due, Some(("u:birth".into(), 3_000)));
    assert_eq!(c.record.fire_ms(false), 3_000);
    assert_eq!(c.record.state, "Inexistent");
    let mut asked = rec;
    asked.cancel_requested = true;
    let c = after_run(
        &asked,
        "u",
        PlanKind::Birth,
        Ended::Retry { next_ms: 3_000 },
        run("b", 1, "retry"),
        "h#1".into(),
        2_000,
    );
    assert_eq!(c.record.state, "Stillbirth");
    assert_eq!(c.order_leave, ["u:birth", "u:death"]);
    assert_eq!(c.record.death.state.as_deref(), Some("Cancelled"));
}

#[test]
fn a_late_birth_cut_off_before_leaves_its_death_to_follow() {
    let mut rec = booked(&life(true, None), 10);
    rec.birth.interrupted = true;
    let c = after_run(
        &rec,
        "u",
        PlanKind::Birth,
        Ended::Invalidated,
        run("b", 2, "invalidated"),
        "h#1".into(),
        400_000,
    );
    assert_eq!(c.record.state, "Alive");
    assert!(c.record.birth_uncertain);
    assert_eq!(c.due, Some(("u:death".into(), 5_000)));
    let plain = booked(&life(true, None), 10);
    let c = after_run(
        &plain,
        "u",
        PlanKind::Birth,
        Ended::Invalidated,
        run("b", 1, "invalidated"),
        "h#1".into(),
        400_000,
    );
    assert_eq!(c.record.state, "Invalidated");
    assert!(c.finished);
}

#[test]
fn a_cancel_before_birth_is_a_stillbirth_and_takes_a_preset_birth_back() {
    let rec = booked(&life(true, Some("r")), 10);
    let preset = Inflight::parse("7|1000|h").unwrap();
    match cancel(&rec, "u", [Some(&preset), None], false, 500) {
        Cancel::Apply(r, ops, to) => {
            assert_eq!(to, LifeState::Stillbirth);
            assert_eq!(r.state, "Stillbirth");
            assert_eq!(
                ops.0,
                [
                    "infl-",
                    "u:birth",
                    "order-",
                    "r",
                    "u:birth",
                    "order-",
                    "r",
                    "u:death",
                    "census",
                    "Inexistent",
                    "Stillbirth",
                    "fin+",
                    "500"
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    let running = Inflight::parse("7|1000|h|1001|1").unwrap();
    let point = booked(&life(false, None), 10);
    assert_eq!(
        cancel(&point, "u", [Some(&running), None], false, 500),
        Cancel::Running
    );
}

#[test]
fn a_patch_of_a_running_plan_is_refused_and_of_a_pending_one_moves_it() {
    let rec = booked(&life(false, None), 10);
    let mut later = life(false, None);
    later.birth_at_ms = 9_000;
    let running = Inflight::parse("7|1000|h|1001|1").unwrap();
    assert_eq!(
        patch(&rec, "u", [Some(&running), None], 0, &later, 0, 500),
        Err(PatchRefusal::NotPending(PlanKind::Birth))
    );
    assert_eq!(
        patch(&rec, "u", [None, None], 3, &later, 0, 500),
        Err(PatchRefusal::Changed)
    );
    let (r, ops) = patch(&rec, "u", [None, None], 0, &later, 0, 500).unwrap();
    assert_eq!(r.birth_ms, 9_000);
    assert_eq!(r.version, 1);
    assert_eq!(
        ops.0,
        [
            "due-", "u:birth", "1000", "due+", "u:birth", "9000", "lives-", "1000", "lives+",
            "9000"
        ]
    );
}
