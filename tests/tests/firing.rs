//! Firing semantics (SPEC sections 1 and 3), end to end: a real redis-server, real
//! `kairos serve` processes and a real HTTP sink. Nothing is mocked; every timing is the
//! machine's own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Waits until every Life in `ids` is in `wanted`; returns their views by id.
async fn wait_all(
    api: &Api,
    ids: &[String],
    wanted: &str,
    within: Duration,
) -> HashMap<String, Value> {
    let deadline = Instant::now() + within;
    let mut views = HashMap::new();
    for id in ids {
        let left = deadline.saturating_duration_since(Instant::now());
        let view = api.wait_life(id, left, |l| state(l) == wanted).await;
        views.insert(id.clone(), view);
    }
    views
}

fn by_life(got: &[Received]) -> HashMap<String, Vec<Received>> {
    let mut map: HashMap<String, Vec<Received>> = HashMap::new();
    for r in got {
        let life = r.header("x-kairos-life").unwrap_or("<none>").to_string();
        map.entry(life).or_default().push(r.clone());
    }
    map
}

/// (p50, p99, max) of a non-empty sample.
fn percentiles(mut sample: Vec<i64>) -> (i64, i64, i64) {
    assert!(!sample.is_empty());
    sample.sort_unstable();
    let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), *sample.last().unwrap())
}

/// Checks that each booked Life was called exactly once, never before its time, with the
/// booked time as X-Kairos-ETA; returns the lateness of each call in ms.
fn exactly_once_never_early(got: &[Received], booked: &HashMap<String, i64>) -> Vec<i64> {
    let calls = by_life(got);
    let strangers: Vec<&String> = calls.keys().filter(|k| !booked.contains_key(*k)).collect();
    assert!(
        strangers.is_empty(),
        "calls for Lives never booked: {strangers:?}"
    );
    let mut lateness = Vec::new();
    for (id, at) in booked {
        let mine = calls.get(id).map(Vec::as_slice).unwrap_or(&[]);
        assert_eq!(mine.len(), 1, "Life {id} was called {} times", mine.len());
        let r = &mine[0];
        assert_eq!(
            r.header("x-kairos-eta"),
            Some(at.to_string().as_str()),
            "{r:?}"
        );
        assert!(
            r.at_ms >= *at,
            "Life {id} fired {} ms early (booked {at}, received {})",
            at - r.at_ms,
            r.at_ms
        );
        lateness.push(r.at_ms - at);
    }
    lateness
}

/// Waits until `host` holds at least `n` Plans in memory (claimed under its lease).
async fn wait_held(redis: &RedisServer, host: &Host, n: i64, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let held = redis.held_by(&host.host_id).await;
        if held >= n {
            return held;
        }
        assert!(
            Instant::now() < deadline,
            "host {} holds {held} Plans, expected {n}; log:\n{}",
            host.host_id,
            host.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// 1. Precision and exactly-once on one host
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_points_fire_once_each_never_early() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let mut booked = HashMap::new();
    for i in 0..200i64 {
        let id = format!("pt{i:03}");
        let at = now_ms() + 1500 + (i * 7919) % 1500;
        book(&api, &point(&id, at, hook(&id))).await;
        booked.insert(id, at);
    }
    sink.wait_count(200, Duration::from_secs(10)).await;
    let ids: Vec<String> = booked.keys().cloned().collect();
    wait_all(&api, &ids, "Dead", Duration::from_secs(10)).await;

    let got = sink.received();
    assert_eq!(got.len(), 200, "every Plan fires once, no more");
    let lateness = exactly_once_never_early(&got, &booked);
    let (p50, p99, max) = percentiles(lateness);
    eprintln!("lateness of 200 point Plans on one host: p50 {p50} ms, p99 {p99} ms, max {max} ms");
    assert!(max < 1000, "a Plan fired {max} ms late");
}

// ---------------------------------------------------------------------------------------
// 2. A term Life end to end, with the headers of SPEC section 3
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_life_births_lives_and_dies_with_headers() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let id = "term-one";
    let birth_ms = now_ms() + 1200;
    let death_ms = birth_ms + 1500;
    let mut body = term(
        id,
        birth_ms,
        death_ms,
        json!({"path": "/on", "method": "POST", "body": {"id": "a0", "method": "activate"}}),
        json!({"path": "/off", "method": "PUT", "body": {"id": "a0", "method": "deactivate"}}),
    );
    body["resource_id"] = json!("conn-42");
    book(&api, &body).await;

    let alive = api
        .wait_life(id, Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    let seen_alive = now_ms();
    assert!(
        seen_alive < death_ms,
        "Alive must be seen before the death time"
    );
    let got = sink.received();
    assert_eq!(got.len(), 1, "only the birth ran while Alive: {got:?}");
    assert_eq!(plan(&alive, "birth")["state"], "Done");
    let dstate = plan(&alive, "death")["state"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        dstate == "Standby" || dstate == "Preset",
        "death Plan waits while Alive, got {dstate}"
    );

    let dead = api
        .wait_life(id, Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    let got = sink.received();
    assert_eq!(got.len(), 2, "birth and death, once each: {got:?}");

    let check = |r: &Received, kind: &str, at: i64, method: &str, path: &str, what: &str| {
        assert_eq!(r.method, method);
        assert_eq!(r.path, path);
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("{id}:{kind}").as_str())
        );
        assert_eq!(r.header("x-kairos-life"), Some(id));
        assert_eq!(r.header("x-kairos-plan"), Some(kind));
        assert_eq!(r.header("x-kairos-execution-count"), Some("1"));
        assert_eq!(r.header("x-kairos-retry-count"), Some("0"));
        assert_eq!(r.header("x-kairos-eta"), Some(at.to_string().as_str()));
        assert_eq!(r.header("x-kairos-resource"), Some("conn-42"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        let sent: Value = serde_json::from_slice(&r.body).expect("JSON body");
        assert_eq!(sent, json!({"id": "a0", "method": what}));
        assert!(r.at_ms >= at, "{kind} fired {} ms early", at - r.at_ms);
        assert!(r.at_ms - at < 1000, "{kind} fired {} ms late", r.at_ms - at);
    };
    check(&got[0], "birth", birth_ms, "POST", "/on", "activate");
    check(&got[1], "death", death_ms, "PUT", "/off", "deactivate");
    assert!(got[1].at_ms >= seen_alive);

    assert_eq!(plan(&dead, "birth")["state"], "Done");
    assert_eq!(plan(&dead, "death")["state"], "Done");
    let h = history(&dead);
    assert_eq!(h.len(), 2, "{dead:#}");
    // Newest first.
    for (entry, kind, at) in [(&h[0], "death", death_ms), (&h[1], "birth", birth_ms)] {
        assert_eq!(entry["plan"], kind);
        assert_eq!(entry["outcome"], "success");
        assert_eq!(entry["status"], 200);
        assert_eq!(entry["attempt"], 1);
        assert_eq!(entry["should_run_at_ms"], at);
        assert_eq!(entry["host"], host.host_id.as_str());
        assert!(entry["started_at_ms"].as_i64().unwrap() >= at, "{entry:#}");
    }
}

// ---------------------------------------------------------------------------------------
// 3. Outcomes: retries, failures, cancellation
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_codes_are_retried_then_succeed_or_fail_for_good() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let action =
        json!({"path": "/hook", "method": "POST", "retry_count": 2, "retry_interval": 0.2});

    // 503, 503, then 200: three calls and Dead.
    sink.answer(&[503, 503]);
    book(&api, &point("retry-ok", now_ms() + 1000, action.clone())).await;
    let life = api
        .wait_life("retry-ok", Duration::from_secs(6), |l| {
            state(l) != "Inexistent"
        })
        .await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let calls = sink.received_for("retry-ok");
    assert_eq!(calls.len(), 3, "{calls:?}");
    for (n, r) in calls.iter().enumerate() {
        assert_eq!(
            r.header("x-kairos-retry-count"),
            Some(n.to_string().as_str())
        );
        assert_eq!(
            r.header("x-kairos-execution-count"),
            Some((n + 1).to_string().as_str())
        );
        assert_eq!(r.header("idempotency-key"), Some("retry-ok:birth"));
    }
    for pair in calls.windows(2) {
        let gap = pair[1].at_ms - pair[0].at_ms;
        assert!(gap >= 200, "retry_interval is 200 ms, gap was {gap} ms");
        assert!(gap < 1200, "retry came {gap} ms after the previous call");
    }
    let p = plan(&life, "birth");
    assert_eq!(p["state"], "Done");
    assert_eq!(p["attempts"], 3);
    assert_eq!(p["last_status"], 200);
    let h = history(&life);
    let outcomes: Vec<(&str, i64)> = h
        .iter()
        .map(|e| {
            (
                e["outcome"].as_str().unwrap(),
                e["status"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![("success", 200), ("retry", 503), ("retry", 503)]
    );

    // 503 three times with retry_count 2: three calls, then the birth fails for good.
    sink.answer(&[503, 503, 503]);
    book(&api, &point("retry-ko", now_ms() + 1000, action.clone())).await;
    let life = api
        .wait_life("retry-ko", Duration::from_secs(6), |l| {
            state(l) != "Inexistent"
        })
        .await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    assert_eq!(sink.received_for("retry-ko").len(), 3);
    assert_eq!(plan(&life, "birth")["state"], "Failed");
    assert_eq!(history(&life)[0]["outcome"], "failed");
    assert_eq!(history(&life)[0]["status"], 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_retryable_code_fails_at_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    sink.answer(&[404]);
    let action =
        json!({"path": "/hook", "method": "POST", "retry_count": 2, "retry_interval": 0.2});
    book(&api, &point("gone", now_ms() + 1000, action)).await;
    // A sentinel booked after it proves the host went on firing after the failure.
    book(&api, &point("after-gone", now_ms() + 1600, hook("after"))).await;
    let life = api
        .wait_life("gone", Duration::from_secs(5), |l| state(l) != "Inexistent")
        .await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    api.wait_life("after-gone", Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    assert_eq!(sink.received_for("gone").len(), 1, "404 is not retried");
    let p = plan(&life, "birth");
    assert_eq!(p["state"], "Failed");
    assert_eq!(p["last_status"], 404);
    let h = history(&life);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["outcome"], "failed");
    assert_eq!(h[0]["status"], 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_cancelled_before_its_time_never_runs() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let at = now_ms() + 1500;
    book(&api, &point("cancelled", at, hook("cancelled"))).await;
    book(&api, &point("sentinel", at + 300, hook("sentinel"))).await;
    // Cancel it once the host holds it in memory (Preset): the timer entry must not fire.
    api.wait_life("cancelled", Duration::from_secs(3), |l| {
        plan(l, "birth")["state"] == "Preset"
    })
    .await;
    let (status, reply) = api.delete("/schedules/cancelled").await;
    assert_eq!(status, 200, "{reply:#}");
    assert_eq!(reply["state"], "Stillbirth");

    // The sentinel fires after the cancelled Plan's time.
    api.wait_life("sentinel", Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    assert!(now_ms() > at);
    assert!(
        sink.received_for("cancelled").is_empty(),
        "a cancelled booking ran: {:?}",
        sink.received_for("cancelled")
    );
    assert_eq!(sink.received().len(), 1, "only the sentinel ran");
    let life = api
        .wait_life("cancelled", Duration::from_secs(1), |_| true)
        .await;
    assert_eq!(state(&life), "Stillbirth");
    assert_eq!(plan(&life, "birth")["state"], "Cancelled");
    assert!(history(&life).is_empty(), "{life:#}");
    // A second DELETE of a finished Life is a conflict.
    let (status, _) = api.delete("/schedules/cancelled").await;
    assert_eq!(status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_an_alive_term_runs_its_death_at_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let birth_ms = now_ms() + 1000;
    let death_ms = birth_ms + 25_000;
    book(
        &api,
        &term("early-end", birth_ms, death_ms, hook("on"), hook("off")),
    )
    .await;
    api.wait_life("early-end", Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    let cancelled_at = now_ms();
    let (status, reply) = api.delete("/schedules/early-end").await;
    assert_eq!(status, 200, "{reply:#}");
    assert_eq!(reply["state"], "Alive", "the death is still to run");

    let got = sink
        .wait_until("the death call", Duration::from_secs(3), |got| {
            got.iter()
                .any(|r| r.header("x-kairos-plan") == Some("death"))
        })
        .await;
    let death = got
        .iter()
        .find(|r| r.header("x-kairos-plan") == Some("death"))
        .unwrap();
    let after = death.at_ms - cancelled_at;
    assert!(after < 1000, "death ran {after} ms after the cancel");
    assert!(death.at_ms < death_ms);
    let life = api
        .wait_life("early-end", Duration::from_secs(3), |l| state(l) == "Dead")
        .await;
    assert_eq!(plan(&life, "death")["state"], "Done");
    assert_eq!(sink.received().len(), 2);
}

// ---------------------------------------------------------------------------------------
// 4. A failing death is retried every death_retry_interval
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_death_is_retried_until_it_succeeds() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // fast_flags: death_retry_interval 300 ms.
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let birth_ms = now_ms() + 1000;
    let death_ms = birth_ms + 1000;
    book(
        &api,
        &term("stubborn", birth_ms, death_ms, hook("on"), hook("off")),
    )
    .await;
    api.wait_life("stubborn", Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    // 500 is retryable, but the death action has retry_count 0: only
    // death_retry_interval brings it back.
    sink.answer(&[500, 500, 500]);

    let is_death = |r: &Received| r.header("x-kairos-plan") == Some("death");
    sink.wait_until("two death calls", Duration::from_secs(5), |got| {
        got.iter().filter(|r| is_death(r)).count() >= 2
    })
    .await;
    let meanwhile = api
        .wait_life("stubborn", Duration::from_secs(1), |_| true)
        .await;
    assert_eq!(
        state(&meanwhile),
        "Alive",
        "a failing death leaves the Life Alive"
    );
    assert_eq!(plan(&meanwhile, "death")["last_status"], 500);

    let life = api
        .wait_life("stubborn", Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    let deaths: Vec<Received> = sink.received().into_iter().filter(is_death).collect();
    assert_eq!(deaths.len(), 4, "three failures, then success: {deaths:?}");
    for (n, r) in deaths.iter().enumerate() {
        assert_eq!(
            r.header("x-kairos-retry-count"),
            Some(n.to_string().as_str())
        );
    }
    for pair in deaths.windows(2) {
        let gap = pair[1].at_ms - pair[0].at_ms;
        assert!(
            gap >= 300,
            "death_retry_interval is 300 ms, gap was {gap} ms"
        );
        assert!(gap < 1300, "death retried only after {gap} ms");
    }
    let death_history: Vec<(String, i64)> = history(&life)
        .iter()
        .filter(|e| e["plan"] == "death")
        .map(|e| {
            (
                e["outcome"].as_str().unwrap().to_string(),
                e["status"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        death_history,
        vec![
            ("success".to_string(), 200),
            ("retry".to_string(), 500),
            ("retry".to_string(), 500),
            ("retry".to_string(), 500)
        ]
    );
    assert_eq!(plan(&life, "death")["state"], "Done");
    assert_eq!(plan(&life, "death")["attempts"], 4);
}

// ---------------------------------------------------------------------------------------
// 5. A host killed with claimed Plans: another host fires them after the lease
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_of_a_killed_host_fire_on_another_host() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let args = flags(&sink, &[("--preset-execution-time", "10s")]);
    let mut first = Host::start(&redis.url(), &args);
    let api = Api::new(&first);

    let mut booked = HashMap::new();
    for i in 0..50i64 {
        let id = format!("k9-{i:02}");
        let at = now_ms() + 3000 + i * 20;
        book(&api, &point(&id, at, hook(&id))).await;
        booked.insert(id, at);
    }
    let held = wait_held(&redis, &first, 50, Duration::from_secs(2)).await;
    assert_eq!(held, 50, "all 50 are claimed into the first host's memory");
    assert_eq!(redis.count_all("due").await, 0);
    first.kill9();
    let killed_at = now_ms();
    assert!(sink.received().is_empty(), "nothing was due yet");

    let second = Host::start(&redis.url(), &args);
    let latest = booked.values().copied().max().unwrap();
    // The lease (2 s) expires, the second host's supervisor takes the Plans back, and they
    // fire at their own times or at once when those passed.
    let budget = (latest.max(killed_at + 2000) + 3000 - now_ms()).max(0) as u64;
    sink.wait_count(50, Duration::from_millis(budget)).await;
    let ids: Vec<String> = booked.keys().cloned().collect();
    let views = wait_all(&Api::new(&second), &ids, "Dead", Duration::from_secs(5)).await;
    let got = sink.received();
    assert_eq!(got.len(), 50);
    let lateness = exactly_once_never_early(&got, &booked);
    let (p50, p99, max) = percentiles(lateness);
    eprintln!("after kill -9, 50 Plans on the second host: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms");
    for view in views.values() {
        assert_eq!(history(view)[0]["host"], second.host_id.as_str());
    }
    assert_eq!(redis.count_all("held").await, 0, "nothing is held any more");
}

// ---------------------------------------------------------------------------------------
// 6. Two hosts on one Redis
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_fire_each_of_two_hundred_plans_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let args = flags(&sink, &[]);
    let a = Host::start(&redis.url(), &args);
    let b = Host::start(&redis.url(), &args);
    let apis = [Api::new(&a), Api::new(&b)];

    let mut booked = HashMap::new();
    for i in 0..200i64 {
        let id = format!("duo{i:03}");
        let at = now_ms() + 1500 + (i * 7919) % 1500;
        book(&apis[(i % 2) as usize], &point(&id, at, hook(&id))).await;
        booked.insert(id, at);
    }
    sink.wait_count(200, Duration::from_secs(10)).await;
    let ids: Vec<String> = booked.keys().cloned().collect();
    let views = wait_all(&apis[0], &ids, "Dead", Duration::from_secs(10)).await;
    let got = sink.received();
    assert_eq!(got.len(), 200, "no Plan runs twice");
    let lateness = exactly_once_never_early(&got, &booked);
    let (p50, p99, max) = percentiles(lateness);
    let mut per_host: HashMap<String, usize> = HashMap::new();
    for view in views.values() {
        let h = history(view);
        assert_eq!(h.len(), 1, "one run each: {view:#}");
        *per_host
            .entry(h[0]["host"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    eprintln!("two hosts, 200 Plans: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms; runs per host {per_host:?}");
    assert!(max < 1000, "a Plan fired {max} ms late");
    for host in per_host.keys() {
        assert!(
            host == &a.host_id || host == &b.host_id,
            "unknown host {host}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_of_one_resource_never_run_at_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(200));
    let args = flags(&sink, &[("--execution-delay-guard-time", "0")]);
    let a = Host::start(&redis.url(), &args);
    let b = Host::start(&redis.url(), &args);
    let apis = [Api::new(&a), Api::new(&b)];

    let base = now_ms() + 1500;
    let mut ids = Vec::new();
    // One resource, births 1 ms apart (the same ms would overlap: 409), booked on both
    // hosts: without the resource lock these calls would overlap, each taking 200 ms.
    for i in 0..5i64 {
        let id = format!("res-{i}");
        let mut body = point(&id, base + i, hook(&id));
        body["resource_id"] = json!("shared");
        book(&apis[(i % 2) as usize], &body).await;
        ids.push(id);
    }
    // Control: Plans without a resource at the same instant do overlap, so the sink's
    // measurement can see concurrency.
    for i in 0..4i64 {
        let id = format!("free-{i}");
        book(&apis[(i % 2) as usize], &point(&id, base, hook(&id))).await;
        ids.push(id);
    }
    sink.wait_count(9, Duration::from_secs(10)).await;
    wait_all(&apis[0], &ids, "Dead", Duration::from_secs(5)).await;

    assert!(
        sink.max_concurrent("") >= 2,
        "control: Plans without resource ran one by one ({})",
        sink.max_concurrent("")
    );
    assert_eq!(
        sink.max_concurrent("shared"),
        1,
        "Plans of one resource overlapped"
    );
    let mut shared: Vec<Received> = sink
        .received()
        .into_iter()
        .filter(|r| r.header("x-kairos-resource") == Some("shared"))
        .collect();
    assert_eq!(shared.len(), 5, "each Plan of the resource ran once");
    shared.sort_by_key(|r| r.at_ms);
    for pair in shared.windows(2) {
        let gap = pair[1].at_ms - pair[0].at_ms;
        assert!(
            gap >= 200,
            "a Plan of the resource started {gap} ms after the previous one"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 7. Redis restarted mid-run
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_plan_fires_across_a_redis_restart() {
    let mut redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    // Plans due before, during and after the outage.
    let mut acked: HashMap<String, i64> = HashMap::new();
    for i in 0..30i64 {
        let id = format!("pre-{i:02}");
        let at = now_ms() + 900 + i * 100;
        book(&api, &point(&id, at, hook(&id))).await;
        acked.insert(id, at);
    }
    let before = acked.len();

    // Keep booking while Redis goes away and comes back; only 200s count.
    let booker = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut acked = HashMap::new();
            let mut acked_at = Vec::new();
            let mut refused = 0;
            let stop = Instant::now() + Duration::from_millis(2500);
            let mut i = 0;
            while Instant::now() < stop {
                let id = format!("mid-{i:03}");
                let at = now_ms() + 1000 + (i % 10) * 100;
                let (status, _) = api.post("/schedules", &point(&id, at, hook(&id))).await;
                if status == 200 {
                    acked.insert(id, at);
                    acked_at.push(now_ms());
                } else {
                    refused += 1;
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            (acked, acked_at, refused)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restart_at = now_ms();
    tokio::task::block_in_place(|| redis.restart_hard(Duration::from_millis(500)));
    let back_at = now_ms();
    let (mid, acked_at, refused) = booker.await.unwrap();
    let after_restart = acked_at.iter().filter(|t| **t > back_at).count();
    eprintln!(
        "redis down {} ms: {before} booked before, {} acknowledged around the restart ({after_restart} after it), {refused} refused",
        back_at - restart_at,
        mid.len()
    );
    assert!(after_restart > 0, "the API books again once Redis is back");
    acked.extend(mid);

    let ids: Vec<String> = acked.keys().cloned().collect();
    wait_all(&api, &ids, "Dead", Duration::from_secs(15)).await;
    let calls = by_life(&sink.received());
    let mut late = Vec::new();
    for (id, at) in &acked {
        let mine = calls.get(id).map(Vec::as_slice).unwrap_or(&[]);
        assert!(!mine.is_empty(), "acknowledged Life {id} never fired");
        assert!(mine[0].at_ms >= *at, "Life {id} fired early");
        late.push(mine[0].at_ms - at);
    }
    let (p50, p99, max) = percentiles(late);
    eprintln!("across the Redis restart: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms");
}

// ---------------------------------------------------------------------------------------
// 8. The outbound policy refuses targets that are not allowed
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_targets_fail_with_a_clear_error_and_are_never_called() {
    let gateway = Sink::start().await;
    let target = Sink::start().await;
    let target_port = target.addr.port();

    // Host 1: no allowlist. A loopback url other than the gateway is refused: at
    // booking when the address is written literally (no DNS answer could allow it), when
    // fired for a name (checked against what it resolves to then).
    let redis1 = RedisServer::start();
    let host1 = Host::start(&redis1.url(), &flags(&gateway, &[]));
    let api1 = Api::new(&host1);
    let (status, reply) = api1
        .post(
            "/schedules",
            &point(
                "literal",
                now_ms() + 1000,
                json!({"url": format!("http://127.0.0.1:{target_port}/blocked"), "method": "POST"}),
            ),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("blocked_target")),
        "{reply}"
    );
    let url = format!("http://localhost:{target_port}/blocked");
    book(
        &api1,
        &point(
            "loopback",
            now_ms() + 1000,
            json!({"url": url, "method": "POST"}),
        ),
    )
    .await;

    // Host 2: any public address, and the target listed by name. A private address is
    // refused; the listed loopback target is called (the control).
    let redis2 = RedisServer::start();
    let allowed = format!("*,127.0.0.1:{target_port}");
    let host2 = Host::start(
        &redis2.url(),
        &flags(&gateway, &[("--allowed-hosts", allowed.as_str())]),
    );
    let api2 = Api::new(&host2);
    let (status, reply) = api2
        .post(
            "/schedules",
            &point(
                "literal-private",
                now_ms() + 1000,
                json!({"url": "http://10.0.0.1/x", "method": "POST"}),
            ),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("blocked_target")),
        "{reply}"
    );
    book(
        &api2,
        &point(
            "private",
            now_ms() + 1000,
            json!({"url": format!("http://localhost:{target_port}/x"), "method": "POST", "connect_timeout": 1}),
        ),
    )
    .await;
    let url = format!("http://127.0.0.1:{target_port}/allowed");
    book(
        &api2,
        &point(
            "listed",
            now_ms() + 1000,
            json!({"url": url, "method": "POST"}),
        ),
    )
    .await;

    let finished = |l: &Value| state(l) != "Inexistent";
    let loopback = api1
        .wait_life("loopback", Duration::from_secs(5), finished)
        .await;
    let private = api2
        .wait_life("private", Duration::from_secs(5), finished)
        .await;
    let listed = api2
        .wait_life("listed", Duration::from_secs(5), finished)
        .await;

    assert_eq!(
        state(&listed),
        "Dead",
        "control: a listed target is called: {listed:#}"
    );
    for (life, needle) in [(&loopback, "allowlist"), (&private, "private")] {
        assert_eq!(state(life), "Stillbirth", "{life:#}");
        let p = plan(life, "birth");
        assert_eq!(p["state"], "Failed");
        let h = history(life);
        assert_eq!(h.len(), 1, "{life:#}");
        assert_eq!(h[0]["outcome"], "failed");
        let error = h[0]["error"].as_str().unwrap_or("");
        assert!(
            error.contains(needle),
            "error should mention {needle}: {error}"
        );
        assert!(error.contains("outbound policy"), "{error}");
        assert_eq!(p["last_error"].as_str(), Some(error));
    }
    let got = target.received();
    assert_eq!(
        got.len(),
        1,
        "only the listed call reached the target: {got:?}"
    );
    assert_eq!(got[0].path, "/allowed");
    assert!(gateway.received().is_empty());
}

// ---------------------------------------------------------------------------------------
// 9. Graceful shutdown hands claimed Plans back
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_claimed_plans_back_at_once() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // A 30 s lease: if the Plans were not handed back, the second host could take them
    // only after 30 s, far beyond this test's waits.
    let args = flags(
        &sink,
        &[("--preset-execution-time", "10s"), ("--lease-ttl", "30s")],
    );
    let mut first = Host::start(&redis.url(), &args);
    let api = Api::new(&first);

    let mut booked = HashMap::new();
    for i in 0..30i64 {
        let id = format!("term-{i:02}");
        let at = now_ms() + 2500 + i * 30;
        book(&api, &point(&id, at, hook(&id))).await;
        booked.insert(id, at);
    }
    assert_eq!(
        wait_held(&redis, &first, 30, Duration::from_secs(2)).await,
        30
    );

    let began = Instant::now();
    let exited = tokio::task::block_in_place(|| first.terminate(Duration::from_secs(10)));
    let took = began.elapsed();
    assert!(
        exited,
        "SIGTERM did not stop the host; log:\n{}",
        first.log_text()
    );
    eprintln!("graceful shutdown with 30 claimed Plans took {took:?}");
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    assert_eq!(redis.count_all("held").await, 0, "nothing still held");
    assert_eq!(
        redis.count_all("due").await,
        30,
        "all handed back to the due set"
    );
    let hosts = redis.cli(&["ZRANGE", "kairos:hosts", "0", "-1"]);
    assert!(
        !hosts.contains(&first.host_id),
        "the stopped host left the hosts set: {hosts}"
    );
    assert!(sink.received().is_empty());
    assert!(
        first.log_text().contains("handed claimed Plans back"),
        "{}",
        first.log_text()
    );

    let second = Host::start(&redis.url(), &args);
    sink.wait_count(30, Duration::from_secs(8)).await;
    let ids: Vec<String> = booked.keys().cloned().collect();
    wait_all(&Api::new(&second), &ids, "Dead", Duration::from_secs(5)).await;
    let lateness = exactly_once_never_early(&sink.received(), &booked);
    let (p50, p99, max) = percentiles(lateness);
    eprintln!("after SIGTERM, 30 Plans on the second host: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms");
    assert!(
        max < 1000,
        "handed-back Plans fire on time, not after the lease ({max} ms)"
    );
}

// ---------------------------------------------------------------------------------------
// 10. Missed births are invalidated; overdue deaths still run
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_birth_missed_beyond_the_limit_is_invalidated() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let args = flags(&sink, &[("--birth-delay-limit-time", "500ms")]);
    let mut first = Host::start(&redis.url(), &args);
    let api = Api::new(&first);

    let birth_ms = now_ms() + 1200;
    book(&api, &point("missed", birth_ms, hook("missed"))).await;
    book(
        &api,
        &term(
            "missed-term",
            birth_ms,
            birth_ms + 1500,
            hook("on"),
            hook("off"),
        ),
    )
    .await;
    wait_held(&redis, &first, 2, Duration::from_secs(1)).await;
    first.kill9();
    let killed_at = now_ms();
    assert!(killed_at < birth_ms, "the host died before the birth time");

    // Down until 1.5 s past the birth (and past the dead host's 2 s lease).
    let resume_at = (birth_ms + 1500).max(killed_at + 2200);
    tokio::time::sleep(Duration::from_millis((resume_at - now_ms()).max(0) as u64)).await;
    let second = Host::start(&redis.url(), &args);
    let api = Api::new(&second);

    let finished = |l: &Value| state(l) != "Inexistent";
    let point_life = api
        .wait_life("missed", Duration::from_secs(5), finished)
        .await;
    let term_life = api
        .wait_life("missed-term", Duration::from_secs(5), finished)
        .await;
    for life in [&point_life, &term_life] {
        assert_eq!(state(life), "Invalidated", "{life:#}");
        let p = plan(life, "birth");
        assert_eq!(p["state"], "Invalidated");
        let h = history(life);
        assert_eq!(h.len(), 1, "{life:#}");
        assert_eq!(h[0]["outcome"], "invalidated");
        let error = h[0]["error"].as_str().unwrap_or("");
        assert!(error.contains("birth_delay_limit_time"), "{error}");
    }
    assert_eq!(plan(&term_life, "death")["state"], "Cancelled");
    // Their outcome says why, and GET /failures lists them.
    for life in [&point_life, &term_life] {
        assert_eq!(life["outcome"], "invalidated", "{life:#}");
        let why = life["outcome_reason"].as_str().unwrap_or("");
        assert!(why.contains("birth_delay_limit_time"), "{life:#}");
    }
    let (_, failures) = api.get("/failures?outcome=invalidated").await;
    assert_eq!(
        failures["items"].as_array().map(Vec::len),
        Some(2),
        "{failures}"
    );
    // A later booking on the second host fires, so the host is working; still nothing
    // of the invalidated Lives reached the sink.
    book(&api, &point("later", now_ms() + 1000, hook("later"))).await;
    api.wait_life("later", Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    let got = sink.received();
    assert_eq!(got.len(), 1, "only the later booking ran: {got:?}");
    assert_eq!(got[0].header("x-kairos-life"), Some("later"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overdue_death_runs_at_once_however_late() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let args = flags(&sink, &[("--birth-delay-limit-time", "500ms")]);
    let mut first = Host::start(&redis.url(), &args);
    let api = Api::new(&first);

    let birth_ms = now_ms() + 1000;
    let death_ms = birth_ms + 1000;
    book(
        &api,
        &term("overdue", birth_ms, death_ms, hook("on"), hook("off")),
    )
    .await;
    api.wait_life("overdue", Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    first.kill9();
    assert!(now_ms() < death_ms, "the host died before the death time");

    let resume_at = death_ms + 1500;
    tokio::time::sleep(Duration::from_millis((resume_at - now_ms()).max(0) as u64)).await;
    let second = Host::start(&redis.url(), &args);
    let started = now_ms();
    let life = Api::new(&second)
        .wait_life("overdue", Duration::from_secs(6), |l| state(l) == "Dead")
        .await;
    let deaths: Vec<Received> = sink
        .received()
        .into_iter()
        .filter(|r| r.header("x-kairos-plan") == Some("death"))
        .collect();
    assert_eq!(deaths.len(), 1, "{deaths:?}");
    assert!(
        deaths[0].at_ms - death_ms >= 1500,
        "the death ran late, beyond the birth limit"
    );
    // Once the first host's lease (2 s) has expired, the second host runs it at once.
    assert!(deaths[0].at_ms - started < 4000);
    assert_eq!(plan(&life, "death")["state"], "Done");
    assert_eq!(history(&life)[0]["host"], second.host_id.as_str());
}
