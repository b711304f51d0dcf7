//! Recurring timers (SPEC section 5) end to end: real redis-server, real kairos hosts,
//! a real HTTP sink. The DST rules are unit-tested in `host/src/schedule/`; fire times are
//! checked against an independent cron implementation by `scripts/cron_oracle.py`.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

fn timer(name: &str, schedule: &str, tag: &str) -> Value {
    json!({"name": name, "schedule": schedule, "action": hook(tag)})
}

/// Requests of one timer, in arrival order.
fn calls(sink: &Sink, name: &str) -> Vec<Received> {
    sink.received()
        .into_iter()
        .filter(|r| r.header("x-kairos-timer") == Some(name))
        .collect()
}

fn eta(r: &Received) -> i64 {
    r.header("x-kairos-eta").unwrap().parse().unwrap()
}

async fn runs(api: &Api, name: &str) -> Vec<Value> {
    let (status, reply) = api.get(&format!("/timers/{name}/runs?limit=200")).await;
    assert_eq!(status, 200, "{reply}");
    reply["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_second_timer_fires_once_a_second_without_overlap_across_two_hosts() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(300));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);

    let (status, reply) = api
        .post("/timers", &timer("tick", "*/1 * * * * *", "tick"))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert!(scheduled(&reply), "{reply:#}");
    assert_eq!(reply["preview_ms"].as_array().unwrap().len(), 5);
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let (status, _) = Api::new(&b)
        .post("/timers/tick/deactivate", &json!({}))
        .await;
    assert_eq!(status, 200);

    let got = calls(&sink, "tick");
    assert!(
        (5..=8).contains(&got.len()),
        "about one call a second over 6.5 s, got {}",
        got.len()
    );
    let etas: Vec<i64> = got.iter().map(eta).collect();
    for pair in etas.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1000,
            "one call per slot, every slot: {etas:?}"
        );
    }
    for r in &got {
        assert!(
            r.at_ms - eta(r) < 800,
            "a call came {} ms after its slot",
            r.at_ms - eta(r)
        );
        assert!(r
            .header("idempotency-key")
            .unwrap()
            .starts_with("tick:timer@"));
    }
    assert_eq!(
        sink.max_concurrent(""),
        1,
        "two runs of one timer overlapped"
    );
    let history = runs(&api, "tick").await;
    assert!(
        history.iter().all(|r| r["outcome"] != "skipped"),
        "{history:#?}"
    );
    let hosts: std::collections::BTreeSet<&str> =
        history.iter().filter_map(|r| r["host"].as_str()).collect();
    assert!(
        hosts.iter().all(|h| *h == a.host_id || *h == b.host_id),
        "{hosts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_run_makes_a_logged_skip_not_an_overlap() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(2_300));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);

    let (status, reply) = api
        .post("/timers", &timer("slow", "*/1 * * * * *", "slow"))
        .await;
    assert_eq!(status, 200, "{reply}");
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    Api::new(&b)
        .post("/timers/slow/deactivate", &json!({}))
        .await;

    let got = calls(&sink, "slow");
    assert!((1..=3).contains(&got.len()), "{} calls", got.len());
    assert_eq!(sink.max_concurrent(""), 1, "a slow run overlapped the next");
    let history = runs(&api, "slow").await;
    let skips: Vec<&Value> = history
        .iter()
        .filter(|r| r["outcome"] == "skipped")
        .collect();
    assert!(!skips.is_empty(), "no skip logged: {history:#?}");
    for skip in &skips {
        assert!(
            skip["reason"].as_str().unwrap().contains("still going"),
            "{skip}"
        );
        assert!(skip["skipped"].as_i64().unwrap() >= 1);
        assert!(skip["should_run_at"].is_string() && skip["should_run_at_ms"].is_i64());
    }
    let ran = history.iter().find(|r| r["outcome"] == "success").unwrap();
    assert!(ran["duration_ms"].as_i64().unwrap() >= 2_000, "{ran}");
    for field in ["should_run_at", "started_at", "host"] {
        assert!(!ran[field].is_null(), "runs list lacks {field}: {ran}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_now_deactivate_activate_and_next_run() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    // Once a year: nothing fires on its own during this test.
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "yearly", "schedule": "0 0 0 1 1 *", "timezone": "Europe/London",
                    "action": hook("yearly"), "priority": 1, "retries": 0, "timeout": "5s"}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let next = reply["next_run_ms"].as_i64().unwrap();
    assert!(next > now_ms() + 86_400_000, "{reply}");
    let preview: Vec<i64> = reply["preview_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(preview.len(), 5);
    assert_eq!(preview[0], next);
    assert!(preview.windows(2).all(|w| w[1] > w[0] + 300 * 86_400_000));
    let (status, reply) = api
        .post("/timers", &timer("yearly", "0 * * * * *", "x"))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_timer"))
    );
    let (status, _) = api
        .post("/timers", &timer("bad", "61 * * * * *", "x"))
        .await;
    assert_eq!(status, 400);
    let (status, _) = api.get("/timers/nope").await;
    assert_eq!(status, 404);

    // Run now.
    let (status, reply) = api.post("/timers/yearly/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_count(1, Duration::from_secs(5)).await;
    let (_, view) = api.get("/timers/yearly").await;
    assert_eq!(
        view["next_run_ms"], next,
        "run-now keeps the schedule: {view:#}"
    );

    // PATCH next_run: fires then, and the schedule goes on afterwards.
    let at = now_ms() + 1_500;
    let (status, reply) = api
        .patch("/timers/yearly", &json!({"next_run": rfc3339_ms(at)}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["next_run_ms"], at);
    let got = sink.wait_count(2, Duration::from_secs(5)).await;
    assert_eq!(eta(&got[1]), at);
    assert!(got[1].at_ms >= at);
    let view = wait_timer(&api, "yearly", |v| v["next_run_ms"] == next).await;
    assert!(scheduled(&view), "{view:#}");

    // Deactivate stops an every-second timer; activate starts it again.
    let (status, _) = api
        .post("/timers", &timer("sec", "*/1 * * * * *", "sec"))
        .await;
    assert_eq!(status, 200);
    sink.wait_until("two ticks", Duration::from_secs(5), |r| {
        r.iter()
            .filter(|r| r.header("x-kairos-timer") == Some("sec"))
            .count()
            >= 2
    })
    .await;
    let (status, reply) = api.post("/timers/sec/deactivate", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["active"], false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = calls(&sink, "sec").len();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        calls(&sink, "sec").len(),
        stopped,
        "a deactivated timer fired"
    );
    let (_, view) = api.get("/timers/sec").await;
    assert_eq!(view["state"], "Inactive", "{view:#}");
    assert!(view["preview_ms"].as_array().unwrap().is_empty());

    let (status, reply) = api.post("/timers/sec/activate", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert!(scheduled(&reply), "{reply:#}");
    sink.wait_until("ticks again", Duration::from_secs(5), |r| {
        r.iter()
            .filter(|r| r.header("x-kairos-timer") == Some("sec"))
            .count()
            >= stopped + 2
    })
    .await;

    let (status, list) = api.get("/timers").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let (status, _) = api.delete("/timers/sec").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after_delete = calls(&sink, "sec").len();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        calls(&sink, "sec").len(),
        after_delete,
        "a deleted timer fired"
    );
    let (status, _) = api.get("/timers/sec").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_a_timer_runs_once_and_logs_the_missed_slots() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let mut host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, _) = api
        .post("/timers", &timer("down", "*/1 * * * * *", "down"))
        .await;
    assert_eq!(status, 200);
    sink.wait_until("a tick", Duration::from_secs(5), |r| !r.is_empty())
        .await;
    assert!(host.terminate(Duration::from_secs(10)));
    let before = calls(&sink, "down").len();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(calls(&sink, "down").len(), before);

    let restarted_at = now_ms();
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let got = sink
        .wait_until("a tick after the restart", Duration::from_secs(5), |r| {
            r.iter()
                .filter(|r| r.header("x-kairos-timer") == Some("down"))
                .count()
                > before
        })
        .await;
    let late = got
        .iter()
        .filter(|r| r.header("x-kairos-timer") == Some("down"))
        .nth(before)
        .unwrap();
    assert!(
        eta(late) < restarted_at - 2_000,
        "the overdue slot runs, once"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after: Vec<i64> = calls(&sink, "down")[before..].iter().map(eta).collect();
    assert!(
        after[1..].iter().all(|e| *e > restarted_at),
        "missed slots ran one by one: {after:?}"
    );
    let history = runs(&api, "down").await;
    let missed = history
        .iter()
        .find(|r| r["outcome"] == "skipped" && r["reason"].as_str().unwrap().starts_with("missed"))
        .unwrap_or_else(|| panic!("no missed-slots record: {history:#?}"));
    assert!(missed["skipped"].as_i64().unwrap() >= 2, "{missed}");
}

/// Waiting for its next slot: in the due set, or already claimed by a host.
fn scheduled(view: &Value) -> bool {
    matches!(view["state"].as_str(), Some("Standby") | Some("Preset"))
}

async fn wait_timer(api: &Api, name: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, view) = api.get(&format!("/timers/{name}")).await;
        if status == 200 && check(&view) {
            return view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timer {name}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_waiting_for_a_worker_go_by_priority() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(600));
    let host = Host::start(&redis.url(), &flags(&sink, &[("--workers", "1")]));
    let api = Api::new(&host);

    // Three timers due in the same second, and a booking just before that holds the only
    // worker until they are all waiting.
    let slot_ms = (now_ms() / 1000 + 3) * 1000;
    let time_of_day = chrono::DateTime::from_timestamp_millis(slot_ms)
        .unwrap()
        .format("%H:%M:%S")
        .to_string();
    for (name, priority) in [("p4", 4), ("p1", 1), ("p3", 3)] {
        let (status, reply) = api
            .post(
                "/timers",
                &json!({"name": name, "schedule": time_of_day, "timezone": "UTC",
                        "action": hook(name), "priority": priority}),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["next_run_ms"], slot_ms);
    }
    book(&api, &point("blocker", slot_ms - 300, hook("blocker"))).await;
    let got = sink.wait_count(4, Duration::from_secs(8)).await;
    let order: Vec<&str> = got
        .iter()
        .map(|r| r.header("x-kairos-timer").unwrap_or("blocker"))
        .collect();
    assert_eq!(order, ["blocker", "p1", "p3", "p4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_timeout_fails_and_is_retried() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(1_500));
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "to", "schedule": "0 0 0 1 1 *", "action": hook("to"),
                    "timeout": "300ms", "retries": 1}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    api.post("/timers/to/run", &json!({})).await;
    sink.wait_count(2, Duration::from_secs(5)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let history = loop {
        let history = runs(&api, "to").await;
        if history.len() >= 2 {
            break history;
        }
        assert!(std::time::Instant::now() < deadline, "{history:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Newest first: the retry failed for good, the first attempt was retried.
    assert_eq!(history[0]["outcome"], "failed", "{history:#?}");
    assert_eq!(history[1]["outcome"], "retry", "{history:#?}");
    for run in &history {
        assert!(
            run["error"].as_str().unwrap().contains("timeout of 300 ms"),
            "{run}"
        );
        assert!(run["duration_ms"].as_i64().unwrap() < 1_000, "{run}");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(sink.received().len(), 2, "retries: 1 means two attempts");
    let (_, view) = api.get("/timers/to").await;
    assert_eq!(view["last_outcome"], "failed");
    assert!(
        scheduled(&view),
        "a failed run leaves the schedule going: {view:#}"
    );
}

// ---------------------------------------------------------------------------------------
// The unix cron dialect (issue: cron that means what people mean). Fire times against an
// independent oracle are checked by scripts/cron_oracle.py; these check the forms end to
// end through the API, a real timer firing, and timers written by the previous dialect.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_minute_in_five_fields_fires_within_its_minute() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let (status, reply) = api
        .post("/timers", &timer("minutely", "* * * * *", "minutely"))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["description"], "Every minute");
    assert_eq!(reply["dst_rule"], "elapsed");
    let first = reply["preview_ms"][0].as_i64().unwrap();
    assert_eq!(first % 60_000, 0, "a 5-field schedule fires at second 0");
    assert!(first > now_ms() && first <= now_ms() + 60_000, "{reply:#}");

    let got = sink.wait_count(1, Duration::from_secs(75)).await;
    let call = got
        .iter()
        .find(|r| r.header("x-kairos-timer") == Some("minutely"))
        .expect("the timer called the sink");
    assert_eq!(eta(call), first, "it ran its first slot");
    assert!(
        call.at_ms >= first && call.at_ms - first < 1_000,
        "called {} ms after its minute began",
        call.at_ms - first
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_form_of_the_dialect_books_and_previews_as_cron_does() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    // From Thursday 2026-11-26 12:00 UTC, each schedule's next three fire times.
    let from = "2026-11-26T12:00:00Z";
    let cases = [
        (
            "weekdays",
            "0 9 * * 1-5",
            "At 09:00, Monday through Friday",
            [
                "2026-11-27T09:00:00Z",
                "2026-11-30T09:00:00Z",
                "2026-12-01T09:00:00Z",
            ],
        ),
        (
            "weekdays-s",
            "0 0 9 * * MON-FRI",
            "At 09:00, Monday through Friday",
            [
                "2026-11-27T09:00:00Z",
                "2026-11-30T09:00:00Z",
                "2026-12-01T09:00:00Z",
            ],
        ),
        (
            "either-day",
            "0 0 1,15 * 3",
            "At 00:00, on days 1 and 15 of the month, and Wednesday",
            [
                "2026-12-01T00:00:00Z",
                "2026-12-02T00:00:00Z",
                "2026-12-09T00:00:00Z",
            ],
        ),
        (
            "last-day",
            "0 18 L * *",
            "At 18:00, on the last day of the month",
            [
                "2026-11-30T18:00:00Z",
                "2026-12-31T18:00:00Z",
                "2027-01-31T18:00:00Z",
            ],
        ),
        (
            "last-weekday",
            "0 18 LW * *",
            "At 18:00, on the last weekday of the month",
            [
                "2026-11-30T18:00:00Z",
                "2026-12-31T18:00:00Z",
                "2027-01-29T18:00:00Z",
            ],
        ),
        (
            "nearest",
            "0 8 15W * *",
            "At 08:00, on the weekday nearest day 15",
            [
                "2026-12-15T08:00:00Z",
                "2027-01-15T08:00:00Z",
                "2027-02-15T08:00:00Z",
            ],
        ),
        (
            "last-friday",
            "30 17 * * 5L",
            "At 17:30, the last Friday of the month",
            [
                "2026-11-27T17:30:00Z",
                "2026-12-25T17:30:00Z",
                "2027-01-29T17:30:00Z",
            ],
        ),
        (
            "second-monday",
            "0 10 * * 1#2",
            "At 10:00, the second Monday of the month",
            [
                "2026-12-14T10:00:00Z",
                "2027-01-11T10:00:00Z",
                "2027-02-08T10:00:00Z",
            ],
        ),
        (
            "weekly",
            "@weekly",
            "At 00:00, Sunday",
            [
                "2026-11-29T00:00:00Z",
                "2026-12-06T00:00:00Z",
                "2026-12-13T00:00:00Z",
            ],
        ),
        (
            "yearly",
            "@yearly",
            "At 00:00, on day 1 of the month, in January",
            [
                "2027-01-01T00:00:00Z",
                "2028-01-01T00:00:00Z",
                "2029-01-01T00:00:00Z",
            ],
        ),
    ];
    for (name, schedule, description, want) in cases {
        let body =
            json!({"name": name, "schedule": schedule, "timezone": "UTC", "action": hook(name)});
        let (status, reply) = api.post("/timers", &body).await;
        assert_eq!(status, 200, "{schedule}: {reply}");
        assert_eq!(reply["description"], description, "{schedule}");
        let (status, view) = api
            .get(&format!("/timers/{name}?preview=3&from={from}"))
            .await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["preview"], json!(want), "{schedule}");
        // The same answer without a timer, from POST /timers/validate.
        let (status, checked) = api
            .post(
                "/timers/validate",
                &json!({"schedule": schedule, "timezone": "UTC", "from": from, "preview": 3}),
            )
            .await;
        assert_eq!(status, 200, "{checked}");
        assert_eq!(checked["preview"], json!(want), "{schedule}");
        assert_eq!(checked["description"], description);
        let key = redis.keyspace().await.timer(name).timer(name);
        let stored = redis.cli(&["HGET", &key, "dialect"]);
        assert_eq!(stored.trim(), "\"unix\"", "{name}");
    }

    // A preview from any instant, whatever the timer's state: the London spring change.
    let (status, _) = api.post("/timers/weekdays/deactivate", &json!({})).await;
    assert_eq!(status, 200);
    let (status, view) = api
        .patch(
            "/timers/weekdays",
            &json!({"schedule": "30 1 * * *", "timezone": "Europe/London"}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    let (_, view) = api
        .get("/timers/weekdays?preview=2&from=2026-03-28T12:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!(["2026-03-29T02:00:00+01:00", "2026-03-30T01:30:00+01:00"]),
        "01:30 does not exist on 29 March: it runs as the clocks jump"
    );
    assert_eq!(view["dst_rule"], "wall_clock");

    // Refusals name the field and the value, store nothing, and answer 400.
    for (schedule, message) in [
        ("0 9 * * 8", "day of week: 8 is out of 0-7"),
        (
            "0 0 30 2 *",
            "day of month: no month named has a day 30, so this never fires",
        ),
        ("@fortnightly", "is not a macro"),
        ("0 9 * *", "has 4 fields"),
    ] {
        let body = json!({"name": "bad", "schedule": schedule, "action": hook("bad")});
        let (status, reply) = api.post("/timers", &body).await;
        assert_eq!(status, 400, "{schedule}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_schedule");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains(message),
            "{schedule}: {reply}"
        );
        let (status, reply) = api
            .post("/timers/validate", &json!({"schedule": schedule}))
            .await;
        assert_eq!(status, 400, "{reply}");
    }
    let (status, _) = api.get("/timers/bad").await;
    assert_eq!(status, 404);
    let (status, reply) = api
        .post(
            "/timers/validate",
            &json!({"schedule": "@daily", "timezone": "Mars/Olympus"}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_timezone"))
    );
}

/// Timers written by the previous build (kept as an RDB under tests/fixtures, with the
/// fire times that build previewed) keep their fire times: their schedules are rewritten
/// into the unix dialect at startup (`1-5`, which meant Sunday to Thursday, becomes
/// `SUN-THU`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_written_by_the_previous_dialect_keep_their_fire_times() {
    let dir = fixtures_dir().join("legacy-timers");
    let redis = RedisServer::start_from_rdb(&dir.join("dump.rdb"));
    // Written before shards too: moved into them first (tests/tests/migrate.rs).
    migrate(&redis);
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let captured_at: i64 = std::fs::read_to_string(dir.join("captured_at_ms"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let previews = std::fs::read_to_string(dir.join("previews.jsonl")).unwrap();
    let mut seen = 0;
    for line in previews.lines() {
        let old: Value = serde_json::from_str(line).unwrap();
        let name = old["name"].as_str().unwrap();
        let want = &old["preview_ms"];
        let (status, view) = api
            .get(&format!(
                "/timers/{name}?preview=40&from={}",
                rfc3339_ms(captured_at)
            ))
            .await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(
            &view["preview_ms"], want,
            "{name}: {} became {}",
            old["schedule"], view["schedule"]
        );
        let key = redis.keyspace().await.timer(name).timer(name);
        let dialect = redis.cli(&["HGET", &key, "dialect"]);
        assert_eq!(dialect.trim(), "\"unix\"", "{name} was rewritten");
        let legacy = redis.cli(&["HGET", &key, "schedule_legacy"]);
        assert_eq!(
            legacy.trim().trim_matches('"'),
            old["schedule"].as_str().unwrap()
        );
        seen += 1;
    }
    assert_eq!(seen, 10);
    let (_, weekdays) = api.get("/timers/weekdays").await;
    assert_eq!(weekdays["schedule"], "0 0 9 * * SUN-THU");
    assert_eq!(weekdays["description"], "At 09:00, Sunday through Thursday");
    let (_, midweek) = api.get("/timers/midweek").await;
    assert_eq!(
        midweek["schedule"], "0 30 8 1,15 * +WED",
        "both day fields still needed"
    );
}

/// Stops `host`, waits `down` while slots of an every-second timer pass, and starts a
/// new host; returns it and when it started.
async fn downtime(redis: &RedisServer, sink: &Sink, mut host: Host, down: Duration) -> (Host, i64) {
    assert!(host.terminate(Duration::from_secs(10)));
    tokio::time::sleep(down).await;
    let restarted_at = now_ms();
    (Host::start(&redis.url(), &flags(sink, &[])), restarted_at)
}

/// Runs of the timer's history that were made (not skipped), oldest first.
fn made(history: &[Value]) -> Vec<&Value> {
    let mut made: Vec<&Value> = history
        .iter()
        .filter(|r| r["outcome"] != "skipped")
        .collect();
    made.sort_by_key(|r| r["started_at_ms"].as_i64());
    made
}

/// Quartz's and Temporal's catch-up: `fire_all` runs each missed slot, oldest first, one
/// at a time, at most `catch_up_limit` late runs; the rest are logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_all_runs_at_most_catch_up_limit_late_runs_in_order() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut body = timer("all", "*/1 * * * * *", "all");
    body["misfire"] = json!("fire_all");
    body["catch_up_limit"] = json!(3);
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        (view["misfire"].clone(), view["catch_up_limit"].clone()),
        (json!("fire_all"), json!(3))
    );
    sink.wait_until("a tick", Duration::from_secs(5), |r| !r.is_empty())
        .await;
    // About six slots pass with no host up.
    let (host, restarted_at) = downtime(&redis, &sink, host, Duration::from_millis(6_000)).await;
    let api = Api::new(&host);
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    api.post("/timers/all/deactivate", &json!({})).await;
    let history = runs(&api, "all").await;
    let late: Vec<&Value> = made(&history)
        .into_iter()
        .filter(|r| r["started_at_ms"].as_i64().unwrap() >= restarted_at)
        .filter(|r| r["should_run_at_ms"].as_i64().unwrap() < restarted_at - 1_000)
        .collect();
    assert_eq!(
        late.len(),
        3,
        "exactly catch_up_limit late runs: {history:#?}"
    );
    let slots: Vec<i64> = late
        .iter()
        .map(|r| r["should_run_at_ms"].as_i64().unwrap())
        .collect();
    assert!(
        slots.windows(2).all(|w| w[1] - w[0] == 1_000),
        "the oldest missed slots, in order: {slots:?}"
    );
    let over = history
        .iter()
        .find(|r| {
            r["outcome"] == "skipped" && r["reason"].as_str().unwrap().contains("catch_up_limit")
        })
        .unwrap_or_else(|| panic!("no skip record past the limit: {history:#?}"));
    assert!(over["skipped"].as_i64().unwrap() >= 1, "{over}");
    assert!(over["should_run_at_ms"].as_i64().unwrap() > *slots.last().unwrap());
    // Then it went on with its ordinary slots.
    assert!(
        made(&history)
            .iter()
            .any(|r| r["should_run_at_ms"].as_i64().unwrap() > restarted_at),
        "{history:#?}"
    );
    assert_eq!(sink.max_concurrent(""), 1, "catch-up runs never overlap");
}

/// Kubernetes' `startingDeadlineSeconds` with `misfire: skip`: a slot that cannot start
/// within the deadline is not run; with `fire_once` it runs once for all that was missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_past_its_starting_deadline_is_skipped_unless_fire_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    for (name, misfire) in [("strict", "skip"), ("once", "fire_once")] {
        let mut body = timer(name, "*/1 * * * * *", name);
        body["misfire"] = json!(misfire);
        body["starting_deadline"] = json!("1s");
        let (status, view) = api.post("/timers", &body).await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["starting_deadline"], 1.0, "{view}");
    }
    sink.wait_until("both ticking", Duration::from_secs(5), |r| {
        ["strict", "once"]
            .iter()
            .all(|n| r.iter().any(|r| r.header("x-kairos-timer") == Some(n)))
    })
    .await;
    let (host, restarted_at) = downtime(&redis, &sink, host, Duration::from_millis(3_500)).await;
    let api = Api::new(&host);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    for name in ["strict", "once"] {
        api.post(&format!("/timers/{name}/deactivate"), &json!({}))
            .await;
    }
    // Calls after the restart for slots from before it (a late run keeps its slot as ETA).
    let late_calls = |name: &str| {
        calls(&sink, name)
            .iter()
            .filter(|r| r.at_ms >= restarted_at && eta(r) < restarted_at - 1_000)
            .count()
    };
    assert_eq!(
        late_calls("strict"),
        0,
        "the overdue slot ran past its deadline"
    );
    assert_eq!(
        late_calls("once"),
        1,
        "fire_once runs the overdue slot once"
    );
    let history = runs(&api, "strict").await;
    let skipped = history
        .iter()
        .find(|r| {
            r["outcome"] == "skipped"
                && r["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("starting deadline"))
        })
        .unwrap_or_else(|| panic!("no run skipped for its deadline: {history:#?}"));
    assert!(
        skipped["should_run_at_ms"].as_i64().unwrap() < restarted_at,
        "{skipped}"
    );
    assert!(
        made(&history)
            .iter()
            .any(|r| r["should_run_at_ms"].as_i64().unwrap() > restarted_at),
        "it goes on with its next slots: {history:#?}"
    );
}

/// `overlap: buffer_one`: a slot that comes while the run is going runs as soon as it
/// ends, instead of being skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_one_runs_the_overlapping_slot_when_the_run_ends() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(1_500));
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut body = timer("buf", "*/1 * * * * *", "buf");
    body["overlap"] = json!("buffer_one");
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    tokio::time::sleep(Duration::from_millis(8_000)).await;
    api.post("/timers/buf/deactivate", &json!({})).await;
    assert_eq!(sink.max_concurrent(""), 1, "never two runs at once");
    let history = runs(&api, "buf").await;
    let made = made(&history);
    assert!(made.len() >= 4, "{history:#?}");
    // Each run after the first starts as the one before ends, for a slot that came
    // while it was going.
    let mut buffered = 0;
    for w in made.windows(2) {
        let ended = w[0]["started_at_ms"].as_i64().unwrap() + w[0]["duration_ms"].as_i64().unwrap();
        let (started, slot) = (
            w[1]["started_at_ms"].as_i64().unwrap(),
            w[1]["should_run_at_ms"].as_i64().unwrap(),
        );
        if started - ended < 400 && slot < started - 200 {
            buffered += 1;
        }
    }
    assert!(buffered >= 2, "runs did not follow each other: {made:#?}");
    assert!(
        history
            .iter()
            .any(|r| r["outcome"] == "skipped"
                && r["reason"].as_str().unwrap().contains("buffer_one")),
        "the slots beyond the one buffered are logged: {history:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclude_dates_and_the_policy_fields_are_checked_and_shown() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut body = timer("daily", "0 9 * * *", "daily");
    body["timezone"] = json!("Europe/Paris");
    body["exclude_dates"] = json!(["2030-01-02", "2030-01-04"]);
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["exclude_dates"], json!(["2030-01-02", "2030-01-04"]));
    assert_eq!(view["misfire"], "skip");
    assert_eq!(view["overlap"], "skip");
    let (_, view) = api
        .get("/timers/daily?preview=3&from=2030-01-01T00:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!([
            "2030-01-01T09:00:00+01:00",
            "2030-01-03T09:00:00+01:00",
            "2030-01-05T09:00:00+01:00"
        ]),
        "{view:#}"
    );
    // PATCH replaces the list.
    let (status, view) = api
        .patch("/timers/daily", &json!({"exclude_dates": []}))
        .await;
    assert_eq!(status, 200, "{view}");
    let (_, view) = api
        .get("/timers/daily?preview=2&from=2030-01-01T00:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!(["2030-01-01T09:00:00+01:00", "2030-01-02T09:00:00+01:00"])
    );
    for (field, value) in [
        ("misfire", json!("later")),
        ("overlap", json!("queue")),
        ("catch_up_limit", json!(0)),
        ("exclude_dates", json!(["2030-02-30"])),
    ] {
        let (status, reply) = api.patch("/timers/daily", &json!({field: value})).await;
        assert_eq!(status, 400, "{field}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_timer_policy", "{reply}");
    }
    let (status, reply) = api
        .patch("/timers/daily", &json!({"starting_deadline": "400d"}))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("invalid_duration"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dst_twice_and_gap_skip_change_a_fixed_time_across_dst() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    // New York leaves DST on 2030-11-03 (01:00-02:00 shows twice) and enters it on
    // 2030-03-10 (02:00-03:00 never shows).
    let mut body = timer("night", "30 1 * * *", "night");
    body["timezone"] = json!("America/New_York");
    body["dst"] = json!({"repeated": "twice"});
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["dst"],
        json!({"repeated": "twice", "gap": "after_gap"})
    );
    let (_, view) = api
        .get("/timers/night?preview=4&from=2030-11-02T00:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!([
            "2030-11-02T01:30:00-04:00",
            "2030-11-03T01:30:00-04:00",
            "2030-11-03T01:30:00-05:00",
            "2030-11-04T01:30:00-05:00"
        ]),
        "{view:#}"
    );
    // Back to the default: the repeated 01:30 runs once.
    let (status, view) = api
        .patch("/timers/night", &json!({"dst": {"repeated": "once"}}))
        .await;
    assert_eq!(status, 200, "{view}");
    let (_, view) = api
        .get("/timers/night?preview=2&from=2030-11-03T00:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!(["2030-11-03T01:30:00-04:00", "2030-11-04T01:30:00-05:00"])
    );

    let mut body = timer("spring", "30 2 * * *", "spring");
    body["timezone"] = json!("America/New_York");
    body["dst"] = json!({"gap": "skip"});
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    let (_, view) = api
        .get("/timers/spring?preview=2&from=2030-03-09T12:00:00Z")
        .await;
    assert_eq!(
        view["preview"],
        json!(["2030-03-11T02:30:00-04:00", "2030-03-12T02:30:00-04:00"]),
        "no run on the 10th, whose 02:30 never shows: {view:#}"
    );
    let (status, view) = api
        .patch("/timers/spring", &json!({"dst": {"gap": "after_gap"}}))
        .await;
    assert_eq!(status, 200, "{view}");
    let (_, view) = api
        .get("/timers/spring?preview=1&from=2030-03-09T12:00:00Z")
        .await;
    assert_eq!(view["preview"], json!(["2030-03-10T03:00:00-04:00"]));

    // Elapsed-time schedules have no choice to make: a dst rule there is refused, also
    // when a PATCH changes the schedule of a timer that has one.
    let mut body = timer("quarter", "*/15 * * * *", "quarter");
    body["dst"] = json!({"repeated": "twice"});
    let (status, reply) = api.post("/timers", &body).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_timer_policy", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("elapsed time"),
        "{reply}"
    );
    let (status, _) = api.get("/timers/quarter").await;
    assert_eq!(status, 404, "a refused timer is not stored");
    let (status, reply) = api
        .patch(
            "/timers/night",
            &json!({"dst": {"repeated": "twice"}, "schedule": "0 * * * *"}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("invalid_timer_policy")),
        "{reply}"
    );
    for dst in [json!({"repeated": "thrice"}), json!({"gap": "before"})] {
        let (status, reply) = api.patch("/timers/night", &json!({ "dst": dst })).await;
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["error"]["code"], "invalid_timer_policy", "{reply}");
    }
    let (status, reply) = api
        .patch("/timers/night", &json!({"dst": {"fold": "twice"}}))
        .await;
    assert_eq!(status, 400, "{reply}");
}

/// `overlap: cancel_running`: a run still going when the next slot comes is cut off then,
/// recorded as cancelled (not retried), and that slot's run starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_running_cuts_off_the_run_when_the_next_slot_comes() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_secs(30));
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut body = timer("cut", "*/2 * * * * *", "cut");
    body["overlap"] = json!("cancel_running");
    let (status, view) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["overlap"], "cancel_running");
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    api.post("/timers/cut/deactivate", &json!({})).await;

    let history = runs(&api, "cut").await;
    let mut cancelled: Vec<&Value> = history
        .iter()
        .filter(|r| r["outcome"] == "cancelled")
        .collect();
    cancelled.sort_by_key(|r| r["started_at_ms"].as_i64().unwrap());
    assert!(cancelled.len() >= 2, "{history:#?}");
    for r in &cancelled {
        let took = r["duration_ms"].as_i64().unwrap();
        assert!(
            (1_000..=2_600).contains(&took),
            "a run is cut off at the next slot, at most 2 s after it began: {r}"
        );
        assert!(
            r["error"].as_str().unwrap().contains("cancel_running"),
            "{r}"
        );
        assert_eq!(r["attempt"], 1, "a cancelled run is not retried: {r}");
    }
    // The slot that cut a run off runs next, at once, and never beside it.
    for w in cancelled.windows(2) {
        let ended = w[0]["started_at_ms"].as_i64().unwrap() + w[0]["duration_ms"].as_i64().unwrap();
        let started = w[1]["started_at_ms"].as_i64().unwrap();
        assert!(started >= ended - 5, "two runs at once: {w:#?}");
        assert!(started - ended < 500, "the next slot waited: {w:#?}");
        let slot = w[1]["should_run_at_ms"].as_i64().unwrap();
        assert!(
            (slot - ended).abs() < 300,
            "it ran the slot that came: {w:#?}"
        );
    }
    assert!(
        history.iter().all(|r| r["outcome"] != "retry"),
        "{history:#?}"
    );
    let (_, metrics) = api.text("/metrics").await;
    assert!(
        metrics.lines().any(|l| l.contains("outcome=\"cancelled\"")
            && l.contains("timer")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Found by the API fuzzer (`scripts/api_fuzz.py`): `?limit=abc` on a timer's runs was
/// ignored (the default limit answered); it is a 400 `invalid_query`, as on every list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_queries_that_do_not_parse_are_400() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .post("/timers", &timer("yearly", "0 0 0 1 1 *", "yearly"))
        .await;
    assert_eq!(status, 200, "{reply}");
    for path in [
        "/timers/yearly/runs?limit=abc",
        "/timers/yearly/runs?limit=-3",
        "/timers/yearly/runs?count=3",
        "/timers/yearly/runs?outcome=nope",
        "/timers/yearly?preview=many",
        "/timers/yearly?preview=101",
        "/timers/yearly?previews=3",
    ] {
        let (status, reply) = api.get(path).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_query", "{path}: {reply}");
    }
    let (status, reply) = api.get("/timers/yearly/runs?limit=200").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["items"], json!([]));
    let (status, reply) = api.get("/timers/yearly?preview=2").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["preview"].as_array().unwrap().len(), 2, "{reply}");
}

/// `GET /timers` pages by name across every shard (`limit`, `next_cursor`), and the CLI
/// follows the pages to list them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_are_listed_in_pages_by_name() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut names: Vec<String> = (0..105)
        .map(|i| format!("t{:03}", (i * 37) % 105))
        .collect();
    for name in &names {
        let (status, reply) = api.post("/timers", &timer(name, "0 3 * * *", name)).await;
        assert_eq!(status, 200, "{reply}");
    }
    names.sort();
    // Pages of 40: 40, 40, 25, in name order, the cursor naming the last of each.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/timers?limit=40&cursor={c}"),
            None => "/timers?limit=40".to_string(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        pages += 1;
        assert_eq!(items.len(), if pages < 3 { 40 } else { 25 }, "{page}");
        seen.extend(
            items
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(Some(c), seen.last().map(String::as_str));
                cursor = Some(c.to_string());
            }
            None => break,
        }
        assert!(pages < 10, "pages never end");
    }
    assert_eq!(seen, names);
    // The default page is 100; a limit outside 1..=1000 is refused.
    let (_, page) = api.get("/timers").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 100);
    assert_eq!(page["next_cursor"], "t099");
    for bad in ["0", "1001", "x"] {
        let (status, reply) = api.get(&format!("/timers?limit={bad}")).await;
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["error"]["code"], "invalid_query", "{reply}");
    }
    // `kairos timers` lists every page.
    let server = format!("http://{}", host.addr);
    let (code, out, err) = kairos_command(&["--server", &server, "timers", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let listed: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, names);
}

/// A `next_run` set by PATCH right after a run-now stands until it fires, whether the
/// PATCH lands while the run is still under way or after it was recorded: the run's
/// finish schedules the time asked for, not the slot its schedule gives, and the PATCH's
/// answer shows that time at once. Many times over with a fast target, then with a slow
/// one so that every PATCH lands while the run is under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_run_patched_after_a_run_now_stands_until_it_fires() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "yearly", "schedule": "0 0 0 1 1 *", "timezone": "UTC",
                    "action": hook("yearly"), "retries": 0}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let slot = reply["next_run_ms"].as_i64().unwrap();
    for (round, delay_ms) in (0..240).map(|i| (i, if i < 200 { 0 } else { 300 })) {
        sink.set_delay(Duration::from_millis(delay_ms));
        let (status, reply) = api.post("/timers/yearly/run", &json!({})).await;
        assert_eq!(status, 200, "round {round}: {reply}");
        let called_at = sink.wait_count(round + 1, Duration::from_secs(5)).await[round].at_ms;
        // A time of its own each round, an hour ahead, never the schedule's slot.
        let at = now_ms() + 3_600_000 + round as i64;
        let (status, reply) = api
            .patch("/timers/yearly", &json!({"next_run": rfc3339_ms(at)}))
            .await;
        assert_eq!(status, 200, "round {round}: {reply}");
        assert_eq!(reply["next_run_ms"], at, "round {round}: {reply:#}");
        // Once the run is recorded, the time asked for is still the next run.
        let view = wait_timer(&api, "yearly", |v| {
            scheduled(v) && v["last_run_at_ms"].as_i64() >= Some(called_at)
        })
        .await;
        assert_eq!(view["next_run_ms"], at, "round {round}: {view:#}");
        assert_ne!(view["next_run_ms"], slot);
    }
    assert_eq!(
        sink.received().len(),
        240,
        "one call per run-now, none at the patched times"
    );
}

/// A timer's runs filter on their outcome: its failures, newest first, among the runs
/// kept (issue 29: failures that show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timers_runs_filter_on_their_outcome() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // Every other run fails for good (no retries).
    sink.answer(&[500, 200, 500, 200, 500, 200]);
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut body = timer("flaky", "* * * * * *", "flaky");
    body["retries"] = json!(0);
    let (status, reply) = api.post("/timers", &body).await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_until("six runs", Duration::from_secs(15), |got| got.len() >= 6)
        .await;
    let (status, _) = api.post("/timers/flaky/deactivate", &json!({})).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all = runs(&api, "flaky").await;
    let failed_all = all.iter().filter(|r| r["outcome"] == "failed").count();
    assert!(failed_all >= 3, "{all:#?}");
    let (status, reply) = api.get("/timers/flaky/runs?outcome=failed&limit=200").await;
    assert_eq!(status, 200, "{reply}");
    let failed = reply["items"].as_array().unwrap();
    assert_eq!(failed.len(), failed_all, "{reply:#}");
    assert!(failed
        .iter()
        .all(|r| r["outcome"] == "failed" && r["status"] == 500));
    let started: Vec<i64> = failed
        .iter()
        .map(|r| r["started_at_ms"].as_i64().unwrap())
        .collect();
    assert!(
        started.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {started:?}"
    );
    let (_, one) = api.get("/timers/flaky/runs?outcome=failed&limit=1").await;
    assert_eq!(one["items"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["items"][0], failed[0]);
    let (_, ok) = api.get("/timers/flaky/runs?outcome=success").await;
    assert!(
        ok["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["outcome"] == "success"),
        "{ok}"
    );
}
