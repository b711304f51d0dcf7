//! Property-based fuzzing of every parser that reads client input: booking bodies (and
//! their actions), PATCH merges, timer bodies and schedules, queue bodies, tasks, plugin
//! upload queries, times and durations. Inputs are valid bodies with fields replaced,
//! dropped or added at random, random JSON, and hostile strings and numbers. Every
//! parser must answer Ok or a 4xx [`ApiError`]: never panic, never a 5xx.
//!
//! The number of cases per property is bounded (`KAIROS_FUZZ_CASES`, default 2,000), so
//! the run takes seconds in CI; set it higher to fuzz longer by hand. The seed is fixed
//! unless `KAIROS_FUZZ_SEED` says otherwise (a number, or `random`): see [`seed`].

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Map, Value};

use crate::bookings::request::{self as booking, Rules};
use crate::error::ApiError;

fn cases() -> u32 {
    std::env::var("KAIROS_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2_000)
}

/// The seed of every runner: fixed (0) unless `KAIROS_FUZZ_SEED` names one, so that the
/// suite is the same run each time and a red CI run is never luck. `KAIROS_FUZZ_SEED=random`
/// picks a fresh seed and prints it, for a long fuzz by hand that can be replayed.
fn seed() -> u64 {
    match std::env::var("KAIROS_FUZZ_SEED").as_deref() {
        Ok("random") => {
            use std::hash::{BuildHasher, RandomState};
            let seed = RandomState::new().hash_one(std::time::SystemTime::now());
            eprintln!("parser fuzz: KAIROS_FUZZ_SEED={seed}");
            seed
        }
        Ok(text) => text.parse().unwrap_or_else(|_| {
            panic!("KAIROS_FUZZ_SEED must be a number or `random`, not {text:?}")
        }),
        Err(_) => 0,
    }
}

fn runner() -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed().to_le_bytes());
    let config = RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// Strings that have broken parsers elsewhere: huge and negative numbers, odd
/// encodings, separators, control characters, long runs.
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("1e308".into()),
        Just("-1".into()),
        Just("18446744073709551616".into()),
        Just("9223372036854775808ms".into()),
        Just("1e16s".into()),
        Just("NaN".into()),
        Just("inf".into()),
        Just("2030-02-30 25:61:61".into()),
        Just("9999-12-31T23:59:59+14:00".into()),
        Just("0000-01-01T00:00:00Z".into()),
        Just("http://[::1]:99999/x".into()),
        Just("http://example.com:0/".into()),
        Just("/a b".into()),
        Just("*/0 * * * *".into()),
        Just("@every 5m".into()),
        Just("0 0 31 2 *".into()),
        Just("\u{0}\u{1}\r\n".into()),
        Just("é".repeat(3000)),
        "[ -~]{0,40}",
        "\\PC{0,20}",
    ]
}

fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e16)),
        Just(json!(1.7976931348623157e308)),
        Just(json!(-1e-300)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        hostile_number(),
        hostile_string().prop_map(Value::String),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::hash_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid body with fields replaced by random values, some dropped, one added.
fn mutated(base: Value) -> impl Strategy<Value = Value> {
    let fields: Vec<String> = base
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    (
        prop::collection::vec((0..fields.len().max(1), any_json()), 0..4),
        prop::collection::vec(0..fields.len().max(1), 0..2),
        prop::option::of(("[a-z_]{1,12}", any_json())),
    )
        .prop_map(move |(replace, drop, add)| {
            let mut body = base.clone();
            let obj = body.as_object_mut().expect("bases are objects");
            for (i, value) in replace {
                if let Some(name) = fields.get(i) {
                    obj.insert(name.clone(), value);
                }
            }
            for i in drop {
                if let Some(name) = fields.get(i) {
                    obj.remove(name);
                }
            }
            if let Some((name, value)) = add {
                obj.insert(name, value);
            }
            body
        })
}

static KNOWN: std::sync::LazyLock<crate::bookings::request::KnownPlugins> =
    std::sync::LazyLock::new(|| crate::bookings::request::KnownPlugins::named(["known"]));

fn rules(now_ms: i64) -> Rules<'static> {
    Rules {
        timezone: chrono_tz::Europe::London,
        minimum_life_term_ms: 180_000,
        execution_guard_ms: 30_000,
        now_ms,
        gateway_configured: true,
        plugins: &KNOWN,
        policy: None,
        placement: crate::store::Placement { shards: 32 },
    }
}

/// Ok, or a refusal with a 4xx status: never a panic, never a 5xx.
fn client_error<T>(
    what: &str,
    input: &Value,
    result: Result<T, ApiError>,
) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        prop_assert!(
            e.status.is_client_error(),
            "{what} answered {} {} for {input}",
            e.status,
            e.code
        );
        prop_assert!(
            !e.message.is_empty(),
            "{what}: an empty message for {input}"
        );
    }
    Ok(())
}

const NOW: i64 = 1_795_000_000_000;

fn action() -> Value {
    json!({"path": "/x", "method": "POST", "headers": {"a": "b"}, "body": {"k": 1},
           "connect_timeout": 5, "request_timeout": "30s", "retry_count": 3, "retry_interval": 1,
           "on_failure": {"path": "/cb", "method": "PUT"}})
}

#[test]
fn booking_bodies_and_their_actions() {
    let term = json!({
        "life_uuid": "abc", "schedule_type": "term", "resource_id": "r1",
        "term": {"birth_time": "2030-01-01 00:00:00", "death_time": "2030-01-01 01:00:00"},
        "birth": action(), "death": {"plugin": "known", "input": {"x": 1}, "timeout": 3},
    });
    let point = json!({"birth_time": "2030-01-01T00:00:00Z", "birth_action": action()});
    let debounced = json!({"birth": action(),
                           "debounce": {"key": "k", "period": "5m", "max_wait": 3600}});
    let strategy = prop_oneof![
        mutated(term),
        mutated(point),
        mutated(debounced),
        any_json()
    ];
    runner()
        .run(&strategy, |body| {
            let text = body.to_string();
            let parsed = booking::parse_request(text.as_bytes());
            let result = parsed.and_then(|r| r.into_booking(&rules(NOW), None));
            client_error("booking", &body, result)
        })
        .unwrap();
    runner()
        .run(&mutated(action()), |a| {
            client_error(
                "action",
                &a,
                booking::parse_action("birth", &a, &rules(NOW)),
            )
        })
        .unwrap();
}

#[test]
fn patches_merge_or_refuse() {
    let current = booking::parse_request(
        json!({"life_uuid": "abc", "schedule_type": "term",
               "term": {"birth_time": "2030-01-01 00:00:00", "death_time": "2030-01-01 01:00:00"},
               "birth": action(), "death": action()})
        .to_string()
        .as_bytes(),
    )
    .unwrap()
    .into_booking(&rules(NOW), None)
    .unwrap()
    .0;
    let patch =
        json!({"death_time": "2030-01-01 02:00:00", "resource_id": "r2", "birth": action()});
    runner()
        .run(&prop_oneof![mutated(patch), any_json()], |body| {
            let result = booking::parse_request(body.to_string().as_bytes())
                .and_then(|r| r.merge_into(&current, &rules(NOW)));
            client_error("patch", &body, result)
        })
        .unwrap();
}

#[test]
fn timer_bodies_and_schedules() {
    let timer = json!({"name": "t", "schedule": "0 9 * * 1-5", "timezone": "Europe/London",
                       "priority": 2, "timeout": "5m", "retries": 3, "active": true,
                       "next_run": "2030-01-01 00:00:00", "action": action()});
    runner()
        .run(&prop_oneof![mutated(timer), any_json()], |body| {
            let result = crate::timers::parse_body(body.to_string().as_bytes()).and_then(|b| {
                let mut def = crate::timers::TimerDef::for_fuzzing();
                crate::timers::apply_settings(b, &mut def, chrono_tz::UTC)
            });
            client_error("timer", &body, result)
        })
        .unwrap();
    runner()
        .run(&hostile_string(), |text| {
            // A schedule either parses or says why; one that parses previews without
            // panicking in any zone.
            if let Ok(s) = crate::schedule::Schedule::parse(&text) {
                let _ = s.preview(NOW, chrono_tz::Australia::Lord_Howe, 3);
                let _ = s.describe();
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn queue_bodies_and_tasks() {
    let queue = json!({"rate": 5.5, "bucket_size": 10, "max_concurrent": 2,
                       "retry": {"limit": 5, "age_limit": "1h", "min_backoff": 0.1,
                                 "max_backoff": "10s", "max_doublings": 4}});
    runner()
        .run(&prop_oneof![mutated(queue), any_json()], |body| {
            let result =
                crate::queues::parse_json::<crate::queues::QueueBody>(body.to_string().as_bytes())
                    .and_then(|q| q.into_def());
            client_error("queue", &body, result)
        })
        .unwrap();
    let task = json!({"name": "t-1", "countdown": 5, "action": action()});
    let task_eta = json!({"name": "t-2", "eta": "2030-01-01 00:00:00", "expire_after": "10m",
                          "action": action()});
    runner()
        .run(
            &prop_oneof![mutated(task), mutated(task_eta), any_json()],
            |item| {
                let result = crate::queues::parse_task(item.clone(), NOW, chrono_tz::UTC, None);
                if let Ok(task) = &result {
                    prop_assert!(
                        task.eta_ms >= NOW,
                        "a task's ETA went before now for {item}"
                    );
                    prop_assert!(
                        task.expires_at_ms.is_none_or(|at| at > task.eta_ms),
                        "a task expires before its ETA for {item}"
                    );
                }
                client_error("task", &item, result)
            },
        )
        .unwrap();
}

#[test]
fn plugin_upload_queries() {
    let entry = prop::collection::hash_map(
        prop_oneof![
            Just("allowed_hosts".to_string()),
            Just("memory_mb".to_string()),
            Just("timeout".to_string()),
            "[a-z_]{1,10}",
        ],
        hostile_string(),
        0..4,
    );
    runner()
        .run(&entry, |query: HashMap<String, String>| {
            let result = crate::api::upload_limits(&query, 64, Duration::from_secs(10));
            client_error("upload query", &json!(query), result)
        })
        .unwrap();
}
