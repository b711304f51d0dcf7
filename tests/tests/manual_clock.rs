//! `kairos serve --clock manual`: users' integration tests move time ahead with
//! `POST /clock`, and every Plan due on the way fires in order, timers included.

use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::json;

fn eta(r: &Received) -> i64 {
    r.header("x-kairos-eta").unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_week_of_an_hourly_timer_runs_in_order_when_the_clock_moves() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--clock", "manual")]));
    let api = Api::new(&host);
    let (_, clock) = api.get("/clock").await;
    assert_eq!(clock["mode"], "manual", "{clock}");
    let start_ms = clock["now_ms"].as_i64().unwrap();

    let (status, view) = api
        .post(
            "/timers",
            &json!({"name": "hourly", "schedule": "0 * * * *", "timezone": "UTC",
                    "action": hook("hourly")}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    // A point Life 90 minutes ahead: it fires between the timer's runs in its turn.
    let (status, life) = api
        .post(
            "/schedules",
            &point("between", start_ms + 90 * 60_000, hook("point")),
        )
        .await;
    assert_eq!(status, 200, "{life}");

    let began = Instant::now();
    let (status, moved) = api.post("/clock", &json!({"advance": "7d"})).await;
    let took = began.elapsed();
    assert_eq!(status, 200, "{moved}");
    eprintln!("a week of an hourly timer: {took:?} of wall time, {moved}");
    assert_eq!(moved["complete"], true, "{moved}");
    assert_eq!(moved["stalled"], 0, "{moved}");
    let now_ms = moved["now_ms"].as_i64().unwrap();
    assert!(now_ms >= start_ms + 7 * 86_400_000, "{moved}");
    assert!(
        took < Duration::from_secs(15),
        "the week was played out, not waited: {took:?}"
    );

    let got = sink.received();
    let timer_runs: Vec<&Received> = got
        .iter()
        .filter(|r| r.header("x-kairos-timer") == Some("hourly"))
        .collect();
    assert!(
        (168..=169).contains(&timer_runs.len()),
        "a week is 168 hourly runs: got {}",
        timer_runs.len()
    );
    // In order, an hour apart, each at the top of an hour.
    for w in timer_runs.windows(2) {
        assert_eq!(eta(w[1]) - eta(w[0]), 3_600_000);
    }
    assert!(timer_runs.iter().all(|r| eta(r) % 3_600_000 == 0));
    // Every call arrived in the order of the times it stood for.
    let etas: Vec<i64> = got.iter().map(eta).collect();
    let mut sorted = etas.clone();
    sorted.sort_unstable();
    assert_eq!(etas, sorted, "calls arrived out of their fire times' order");
    assert_eq!(
        got.iter()
            .filter(|r| r.header("x-kairos-life") == Some("between"))
            .count(),
        1
    );
    let (_, life) = api.get("/schedules/between").await;
    assert_eq!(life["state"], "Dead", "{life}");

    // The host's leases run on the machine's clock: it is healthy and still books.
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
    let (status, life) = api
        .post(
            "/schedules",
            &point("after", now_ms + 60_000, hook("after")),
        )
        .await;
    assert_eq!(status, 200, "{life}");
    let (_, runs) = api.get("/timers/hourly").await;
    assert!(
        runs["next_run_ms"].as_i64().unwrap() > now_ms,
        "the timer's next run is after the new time: {runs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_moves_only_ahead_and_only_when_manual() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let system = Host::start(&redis.url(), &flags(&sink, &[]));
    let (_, clock) = Api::new(&system).get("/clock").await;
    assert_eq!(clock["mode"], "system");
    let (status, reply) = Api::new(&system)
        .post("/clock", &json!({"advance": "1h"}))
        .await;
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"]["code"], "clock_not_manual");

    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&sink, &[("--clock", "manual")]));
    let api = Api::new(&host);
    for (body, code) in [
        (json!({}), "invalid_clock"),
        (
            json!({"advance": "1h", "set": "2031-01-01T00:00:00Z"}),
            "invalid_clock",
        ),
        (json!({"advance": "soon"}), "invalid_duration"),
        (json!({"set": "2001-01-01T00:00:00Z"}), "invalid_clock"),
        (json!({"advance": "20000d"}), "invalid_clock"),
    ] {
        let (status, reply) = api.post("/clock", &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{body}: {reply}");
    }
    let (status, reply) = api.post("/clock", &json!({"rewind": "1h"})).await;
    assert_eq!(status, 400, "{reply}");
    let (_, before) = api.get("/clock").await;
    let (status, moved) = api
        .post("/clock", &json!({"set": "2031-06-01T12:00:00Z"}))
        .await;
    assert_eq!(status, 200, "{moved}");
    assert!(moved["now"]
        .as_str()
        .unwrap()
        .starts_with("2031-06-01T12:00:00"));
    assert!(moved["now_ms"].as_i64() > before["now_ms"].as_i64());
    // A booking's "too soon" guard goes by the moved clock.
    let (status, reply) = api
        .post(
            "/schedules",
            &point(
                "past",
                before["now_ms"].as_i64().unwrap() + 3_600_000,
                hook("p"),
            ),
        )
        .await;
    assert_eq!(
        status, 406,
        "an hour after the old time is now in the past: {reply}"
    );
}
