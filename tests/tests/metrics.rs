//! `/metrics`: Prometheus counters of bookings and runs, the lateness histogram, and
//! gauges read from the host and from Redis.

use std::collections::HashMap;
use std::time::Duration;

use kairos_e2e::*;
use serde_json::json;

/// Sample lines of the exposition text, by name with labels.
async fn scrape(host: &Host) -> HashMap<String, f64> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<axum::body::Bytes>>();
    let resp = client
        .get(host.url("/metrics").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(body.to_vec())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_bookings_runs_and_lateness() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let at = now_ms() + 1_000;
    book(&api, &point("m1", at, hook("m1"))).await;
    book(&api, &point("m2", at, hook("m2"))).await;
    book(&api, &point("m3", at + 50, hook("m3"))).await;
    book(&api, &point("later", at + 3_600_000, hook("later"))).await;
    let (status, _) = api.post("/schedules", &json!({"birth": hook("x")})).await;
    assert_eq!(status, 400);
    sink.answer(&[200, 200, 404]);

    for id in ["m1", "m2", "m3"] {
        api.wait_life(id, Duration::from_secs(10), |l| {
            matches!(state(l), "Dead" | "Stillbirth")
        })
        .await;
    }
    let m = scrape(&host).await;
    assert_eq!(m["kairos_bookings_total{result=\"accepted\"}"], 4.0);
    assert_eq!(m["kairos_bookings_total{result=\"refused\"}"], 1.0);
    assert_eq!(
        m["kairos_runs_total{plan=\"birth\",outcome=\"success\"}"],
        2.0
    );
    assert_eq!(
        m["kairos_runs_total{plan=\"birth\",outcome=\"failed\"}"],
        1.0
    );
    assert_eq!(
        m["kairos_runs_total{plan=\"death\",outcome=\"success\"}"],
        0.0
    );
    assert_eq!(m["kairos_fire_lateness_seconds_count"], 3.0);
    assert_eq!(m["kairos_fire_lateness_seconds_bucket{le=\"+Inf\"}"], 3.0);
    assert!(
        m["kairos_fire_lateness_seconds_bucket{le=\"1\"}"] >= 3.0,
        "runs started within 1 s of their time"
    );
    assert!(m["kairos_fire_lateness_seconds_sum"] < 3.0);
    // The far booking waits in Redis (not yet in the 5-minute look-ahead); one host is alive.
    assert_eq!(m["kairos_due_plans"], 1.0);
    assert_eq!(m["kairos_hosts_alive"], 1.0);
    assert_eq!(m["kairos_claimed_plans"], 0.0);
    assert_eq!(m["kairos_running_plans"], 0.0);
    // Nothing is late; the three fired Lives are history; which build this is.
    assert_eq!(m["kairos_overdue_plans"], 0.0);
    assert_eq!(m["kairos_oldest_overdue_plan_age_seconds"], 0.0);
    assert_eq!(m["kairos_history_lives"], 3.0);
    assert_eq!(
        m[&format!(
            "kairos_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )],
        1.0
    );
}

/// Retries are counted by reason, and every call's duration by action kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_by_reason_and_run_durations() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.answer(&[503, 429, 200]);
    let action =
        json!({"path": "/hook", "method": "POST", "retry_count": 3, "retry_interval": 0.2});
    book(&api, &point("r1", now_ms() + 1_000, action)).await;
    api.wait_life("r1", Duration::from_secs(15), |l| state(l) == "Dead")
        .await;
    let m = scrape(&host).await;
    assert_eq!(m["kairos_retries_total{reason=\"server_error\"}"], 1.0);
    assert_eq!(m["kairos_retries_total{reason=\"rate_limited\"}"], 1.0);
    assert_eq!(
        m["kairos_retries_total{reason=\"connect_or_timeout\"}"],
        0.0
    );
    assert_eq!(
        m["kairos_run_duration_seconds_count{action=\"webhook\"}"],
        3.0
    );
    assert_eq!(
        m["kairos_run_duration_seconds_bucket{action=\"webhook\",le=\"+Inf\"}"],
        3.0
    );
    assert!(m["kairos_run_duration_seconds_bucket{action=\"webhook\",le=\"1\"}"] >= 3.0);
    assert_eq!(
        m["kairos_run_duration_seconds_count{action=\"plugin\"}"],
        0.0
    );
}

/// `--metrics-listen` serves /metrics alone, without a token, for scrapers; the API
/// keeps asking for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_an_address_of_their_own_without_a_token() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let port = free_port();
    let host = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[
                ("--api-tokens", "s3cret:read"),
                ("--metrics-listen", &format!("127.0.0.1:{port}")),
            ],
        ),
    );
    let scraper = Api::at(&format!("http://127.0.0.1:{port}"));
    let (status, text) = scraper.text("/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("kairos_hosts_alive 1"), "{text}");
    assert_eq!(
        scraper.get("/schedules").await.0,
        404,
        "only /metrics there"
    );
    let api = Api::new(&host);
    assert_eq!(api.text("/metrics").await.0, 401);
    assert_eq!(api.with_token("s3cret").text("/metrics").await.0, 200);
}

/// Series per queue (tasks by state) and per timer (last outcome, last and next run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_timers_have_series_of_their_own() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, body) = api
        .put("/queues/mail", &json!({"rate": 1, "max_concurrent": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .post(
            "/queues/mail/tasks",
            &json!([{"name": "a", "countdown": "1h", "action": hook("a")},
                    {"name": "b", "countdown": "1h", "action": hook("b")}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "* * * * * *", "timezone": "UTC", "action": hook("tick")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    sink.wait_until("the timer ran", Duration::from_secs(10), |got| {
        got.iter()
            .any(|r| r.header("x-kairos-timer") == Some("tick"))
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&host).await;
        if m.contains_key("kairos_timer_last_outcome{timer=\"tick\",outcome=\"success\"}") {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        m["kairos_queue_tasks{queue=\"mail\",state=\"pending\"}"],
        2.0
    );
    assert_eq!(
        m["kairos_queue_tasks{queue=\"mail\",state=\"running\"}"],
        0.0
    );
    assert_eq!(
        m["kairos_queue_tasks{queue=\"mail\",state=\"failed\"}"],
        0.0
    );
    let now = now_ms() as f64 / 1000.0;
    let last = m["kairos_timer_last_run_timestamp_seconds{timer=\"tick\"}"];
    let next = m["kairos_timer_next_run_timestamp_seconds{timer=\"tick\"}"];
    assert!(now - 10.0 < last && last <= now + 1.0, "{last} vs {now}");
    assert!(next > last && next <= now + 2.0, "{next} vs {now}");
}

/// Per-timer lateness of the last run, and plugin invocation time by plugin name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_lateness_and_plugin_invocation_time() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    upload_plugin(&api, "noop", "noop", "").await;
    book(
        &api,
        &point(
            "p1",
            now_ms() + 1_000,
            json!({"plugin": "noop@1", "input": {}}),
        ),
    )
    .await;
    let (status, body) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "* * * * * *", "timezone": "UTC", "action": hook("tick")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    api.wait_life("p1", Duration::from_secs(15), |l| state(l) == "Dead")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&host).await;
        if m.contains_key("kairos_timer_last_lateness_seconds{timer=\"tick\"}") {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let late = m["kairos_timer_last_lateness_seconds{timer=\"tick\"}"];
    assert!(
        (0.0..1.0).contains(&late),
        "a timer slot started {late} s late"
    );
    // Counted under the plugin's name, whatever version the booking named.
    assert_eq!(
        m["kairos_plugin_invocation_seconds_count{plugin=\"noop\"}"],
        1.0
    );
    assert_eq!(
        m["kairos_plugin_invocation_seconds_bucket{plugin=\"noop\",le=\"+Inf\"}"],
        1.0
    );
    assert!(m["kairos_plugin_invocation_seconds_sum{plugin=\"noop\"}"] > 0.0);
    assert!(!m.keys().any(|k| k.contains("noop@")), "{m:?}");
}

/// The REST API's requests are counted by route template (never by path), method and
/// status, with a latency histogram, so that 5xx answers and slow bookings can be alerted
/// on; a request no route matched counts under `unmatched`. The `process_*` series of
/// every Prometheus client are there, and `kairos_runs_total` names a timer's or queue's
/// runs by their name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_are_counted_by_route_method_and_status() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let far = now_ms() + 3_600_000;
    book(&api, &point("r1", far, hook("r1"))).await;
    book(&api, &point("r2", far, hook("r2"))).await;
    let (status, _) = api.post("/schedules", &json!({"birth": hook("x")})).await;
    assert_eq!(status, 400);
    for id in ["r1", "r2", "nobody"] {
        api.get(&format!("/schedules/{id}")).await;
    }
    for path in ["/no/such/route/1", "/no/such/route/2"] {
        assert_eq!(api.get(path).await.0, 404);
    }
    let (status, _) = api
        .raw(axum::http::Method::PATCH, "/metrics", Vec::new(), &[])
        .await;
    assert_eq!(status, 405);

    let m = scrape(&host).await;
    let requests = |labels: &str| {
        m.get(&format!("kairos_http_requests_total{{{labels}}}"))
            .copied()
            .unwrap_or_else(|| panic!("no kairos_http_requests_total{{{labels}}} in {m:?}"))
    };
    assert_eq!(
        requests("route=\"/schedules\",method=\"POST\",status=\"200\""),
        2.0
    );
    assert_eq!(
        requests("route=\"/schedules\",method=\"POST\",status=\"400\""),
        1.0
    );
    let one = "route=\"/schedules/{life_uuid}\",method=\"GET\"";
    assert_eq!(requests(&format!("{one},status=\"200\"")), 2.0);
    assert_eq!(requests(&format!("{one},status=\"404\"")), 1.0);
    assert_eq!(
        requests("route=\"unmatched\",method=\"GET\",status=\"404\""),
        2.0
    );
    assert_eq!(
        requests("route=\"/metrics\",method=\"PATCH\",status=\"405\""),
        1.0
    );
    assert!(
        !m.keys()
            .any(|k| k.contains("nobody") || k.contains("/no/such")),
        "{m:?}"
    );
    assert_eq!(
        m[&format!("kairos_http_request_duration_seconds_count{{{one}}}")],
        3.0
    );
    assert_eq!(
        m[&format!("kairos_http_request_duration_seconds_bucket{{{one},le=\"+Inf\"}}")],
        3.0
    );
    assert!(m[&format!("kairos_http_request_duration_seconds_sum{{{one}}}")] > 0.0);

    // The host's process, not this test's.
    assert!(m["process_resident_memory_bytes"] > 1e6, "{m:?}");
    assert!(m["process_open_fds"] >= 5.0);
    assert!(m["process_max_fds"] >= m["process_open_fds"]);
    assert!(m["process_cpu_seconds_total"] > 0.0);
    let now_s = now_ms() as f64 / 1000.0;
    let started = m["process_start_time_seconds"];
    assert!(
        started <= now_s + 1.0 && started > now_s - 120.0,
        "{started} vs {now_s}"
    );

    // A timer's runs under its name.
    let (status, body) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "* * * * * *", "timezone": "UTC", "action": hook("tick")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(&host).await;
        let key = "kairos_runs_total{plan=\"timer\",timer=\"tick\",outcome=\"success\"}";
        if m.get(key).is_some_and(|n| *n >= 1.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no {key} in {m:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `promtool check metrics` (Debian's `prometheus` package) finds nothing to say about
/// the exposition of a host that has fired Lives (webhook and plugin), a timer and queue
/// tasks, with a failure and a retry among them: no error and no lint warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_passes_promtool_check_metrics() {
    const INSTALL: &str = "apt-get install -y --no-install-recommends prometheus";
    let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.join("promtool")),
        )
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("promtool is not installed: `{INSTALL}` (scripts/test does this)")
        });

    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    upload_plugin(&api, "noop", "noop", "").await;
    // A success, a retried 503, a failure (404), a plugin run. Each booking has a path
    // of its own: the queue task and the timer below call the sink too, and once took
    // the answers scripted for these in the order calls came.
    sink.answer_paths(&[("/hook", 200), ("/w1", 200), ("/w3", 404)]);
    sink.answer(&[503, 200]);
    let at = now_ms() + 1_000;
    let call = |path: &str| json!({"path": path, "method": "POST"});
    book(&api, &point("w1", at, call("/w1"))).await;
    let retried = json!({"path": "/w2", "method": "POST", "retry_count": 1, "retry_interval": 0.1});
    book(&api, &point("w2", at + 100, retried)).await;
    book(&api, &point("w3", at + 400, call("/w3"))).await;
    book(
        &api,
        &point("p1", at, json!({"plugin": "noop", "input": {}})),
    )
    .await;
    let (status, body) = api
        .put("/queues/mail", &json!({"rate": 5, "max_concurrent": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .post(
            "/queues/mail/tasks",
            &json!([{"name": "now", "action": hook("now")},
                    {"name": "later", "countdown": "1h", "action": hook("later")}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "* * * * * *", "timezone": "UTC", "action": hook("tick")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for id in ["w1", "w2", "w3", "p1"] {
        api.wait_life(id, Duration::from_secs(15), |l| {
            matches!(state(l), "Dead" | "Stillbirth")
        })
        .await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (status, text) = api.text("/metrics").await;
        assert_eq!(status, 200);
        if text.contains("kairos_timer_last_lateness_seconds{timer=\"tick\"}")
            && text
                .contains("kairos_runs_total{plan=\"task\",queue=\"mail\",outcome=\"success\"} 1")
        {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        text.contains("kairos_retries_total{reason=\"server_error\"} 1"),
        "{text}"
    );

    use std::io::Write;
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not run ({e}): `{INSTALL}`", promtool.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}) says:\n{said}\non:\n{text}",
        out.status
    );
    check_monitoring_files(&promtool, &text);
}

/// The alert rules and the Grafana dashboard of `docs/monitoring/`: `promtool test rules`
/// proves each alert fires (once per fleet) and stays quiet as its test file says; every
/// panel's query parses (checked by promtool as a recording rule); and every kairos or
/// process series they name is one a live host exports (`text`), so that a renamed
/// series cannot leave them silently empty.
fn check_monitoring_files(promtool: &std::path::Path, text: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring");
    let promtool_says = |args: &[&str]| {
        let out = std::process::Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?} says:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    promtool_says(&["test", "rules", "kairos-alerts.test.yml"]);

    let rules = std::fs::read_to_string(dir.join("kairos-alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(dir.join("grafana-kairos.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 15, "{queries:?}");
    // Grafana's variables, as Prometheus would get them once Grafana has filled them in.
    let as_rules: String = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let q = q.replace("$__rate_interval", "5m").replace("$job", ".*");
            format!(
                "      - record: kairos:panel_{i}\n        expr: {}\n",
                json!(q)
            )
        })
        .collect();
    let dir = TempDir::new("grafana");
    let file = dir.0.join("grafana-queries.yml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: panels\n    rules:\n{as_rules}"),
    )
    .unwrap();
    promtool_says(&["check", "rules", file.to_str().unwrap()]);

    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let named = queries.iter().map(String::as_str).chain([rules.as_str()]);
    let mut missing = Vec::new();
    let mut seen = 0;
    for source in named {
        for word in source.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !(word.starts_with("kairos_") || word.starts_with("process_")) {
                continue;
            }
            seen += 1;
            if !exported.contains(word) {
                missing.push(word.to_string());
            }
        }
    }
    assert!(seen >= 30, "only {seen} series named");
    assert!(missing.is_empty(), "named but not exported: {missing:?}");
}

/// `kairos_lives{state}`: the Lives per state of every shard, kept by the scripts as the
/// Lives change; `kairos_failed_runs_last_hour`: runs that failed for good, counted by
/// whichever host ran them and read the same on every host. A census missing (a
/// keyspace written before it) is counted afresh from the Lives themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lives_per_state_and_failures_of_the_last_hour_count_every_host() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);
    sink.answer_paths(&[("/missing", 404)]);
    let at = now_ms() + 1_500;
    let far = at + 3_600_000;
    // Two succeed (Dead), two fail for good (404: Stillbirth), one term lives on (Alive),
    // one waits (Inexistent), one is cancelled before its birth (Stillbirth).
    for id in ["ok1", "ok2"] {
        book(&api, &point(id, at, hook(id))).await;
    }
    for id in ["bad1", "bad2"] {
        let mut action = hook(id);
        action["path"] = json!("/missing");
        book(&api, &point(id, at, action)).await;
    }
    book(
        &api,
        &term("alive", at, far, hook("alive"), hook("alive-death")),
    )
    .await;
    book(&api, &point("later", far, hook("later"))).await;
    book(&api, &point("cancelled", far, hook("cancelled"))).await;
    assert_eq!(api.delete("/schedules/cancelled").await.0, 200);

    let want = [
        ("Inexistent", 1.0),
        ("Alive", 1.0),
        ("Dead", 2.0),
        ("Stillbirth", 3.0),
        ("Invalidated", 0.0),
    ];
    let settled = |m: &HashMap<String, f64>| {
        want.iter()
            .all(|(s, n)| m.get(&format!("kairos_lives{{state=\"{s}\"}}")) == Some(n))
            && m.get("kairos_failed_runs_last_hour") == Some(&2.0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (ma, mb) = (scrape(&a).await, scrape(&b).await);
        if settled(&ma) && settled(&mb) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lives per state and failures not as booked: {:?}",
            ma.iter()
                .filter(|(k, _)| k.starts_with("kairos_lives") || k.contains("failed_runs"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Recounted from the Lives when the census is gone: the same numbers.
    let keys = redis.keyspace().await.every("census");
    let mut conn = redis.conn().await;
    let marked: i64 = {
        let mut n = 0;
        for key in &keys {
            n += redis::cmd("HEXISTS")
                .arg(key)
                .arg("v")
                .query_async::<i64>(&mut conn)
                .await
                .unwrap();
        }
        n
    };
    assert_eq!(marked, keys.len() as i64, "every shard's census is marked");
    let _: i64 = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    let m = scrape(&b).await;
    assert!(settled(&m), "recounted: {m:?}");
}

/// Lives swept from the history leave the census too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lives_swept_from_the_history_leave_the_count_of_their_state() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // A shard keeps one finished Life (32 over 32 shards).
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--history-max-lives", "32")]),
    );
    let api = Api::new(&host);
    let at = now_ms() + 1_500;
    // One resource: all three in one shard, a second and a half apart (its guard).
    for (i, id) in ["s1", "s2", "s3"].into_iter().enumerate() {
        let mut body = point(id, at + i as i64 * 1_500, hook(id));
        body["resource_id"] = json!("swept");
        book(&api, &body).await;
    }
    api.wait_life("s3", Duration::from_secs(20), |l| state(l) == "Dead")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = scrape(&host).await;
        let dead = m["kairos_lives{state=\"Dead\"}"];
        if m["kairos_history_lives"] == 1.0 && dead == 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "history kept {} Lives, counted {dead} Dead",
            m["kairos_history_lives"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
