//! Tests of `record.rs`: the compact form of a Life and what it reads back as.

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
        text.starts_with(r#"{"s":"Alive","b":1923577500000,"d":1923577600000,"r":"conn-42","c":"#),
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
