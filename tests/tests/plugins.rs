//! WebAssembly plugins end to end (SPEC section 7): real components built from
//! `plugins/`, uploaded over REST, fired by real hosts against a real sink.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::Method;
use kairos_e2e::*;
use serde_json::{json, Value};

/// A Redis, a sink as gateway, one host with the fast test timings, and its API.
async fn start() -> (RedisServer, Sink, Host, Api) {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    (redis, sink, host, api)
}

/// The upload query that lets a plugin call the sink.
fn allow_sink(sink: &Sink) -> String {
    format!("allowed_hosts=127.0.0.1:{}", sink.addr.port())
}

fn plugin_point(uuid: &str, at_ms: i64, plugin: &str, input: Value) -> Value {
    point(uuid, at_ms, json!({"plugin": plugin, "input": input}))
}

async fn wait_finished(api: &Api, id: &str) -> Value {
    api.wait_life(id, Duration::from_secs(20), |l| {
        matches!(state(l), "Dead" | "Stillbirth" | "Invalidated")
    })
    .await
}

fn only_run(life: &Value) -> Value {
    let runs = history(life);
    assert_eq!(runs.len(), 1, "one run expected: {life:#}");
    runs[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_action_fires_with_its_output_and_logs_and_reaches_an_allowed_sink() {
    let (_redis, sink, _host, api) = start().await;
    let port = sink.addr.port();

    let meta = upload_plugin(
        &api,
        "http-forward",
        "http-forward",
        &format!("allowed_hosts=127.0.0.1:{port}&timeout=5s"),
    )
    .await;
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["allowed_hosts"], json!([format!("127.0.0.1:{port}")]));
    assert_eq!(meta["digest"].as_str().unwrap().len(), 64);

    let at = now_ms() + 1_500;
    let id = "7f000000-0000-4000-8000-000000000001";
    book(
        &api,
        &plugin_point(
            id,
            at,
            "http-forward",
            json!({
                "url": format!("{}/forwarded?x=1", sink.base_url()),
                "headers": {"x-custom": "yes"},
                "body": {"order": 42},
            }),
        ),
    )
    .await;
    let life = wait_finished(&api, id).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let run = only_run(&life);
    assert_eq!(run["output"], json!({"status": 200}), "{run:#}");
    let logs: Vec<String> = serde_json::from_value(run["logs"].clone()).unwrap();
    assert!(
        logs.iter()
            .any(|l| l.contains("POST") && l.ends_with("-> 200")),
        "{logs:?}"
    );

    let got = sink.received();
    assert_eq!(got.len(), 1, "one outbound call");
    let call = &got[0];
    assert_eq!(call.method, "POST");
    assert_eq!(call.path, "/forwarded");
    assert_eq!(call.query.as_deref(), Some("x=1"));
    assert_eq!(call.header("x-custom"), Some("yes"));
    assert_eq!(call.header("x-kairos-life"), Some(id));
    assert_eq!(call.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(body, json!({"order": 42}));
    assert!(
        call.at_ms >= at,
        "the plugin ran {} ms early",
        at - call.at_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_notify_posts_the_rendered_message() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(&api, "chat", "chat-notify", &allow_sink(&sink)).await;

    let id = "7f000000-0000-4000-8000-000000000002";
    book(
        &api,
        &plugin_point(
            id,
            now_ms() + 1_000,
            "chat",
            json!({
                "webhook_url": format!("{}/services/T0/B0", sink.base_url()),
                "template": "Deploy of {service} is {status} ({life_id})",
                "vars": {"service": "api", "status": "done"},
                "username": "kairos",
            }),
        ),
    )
    .await;
    let life = wait_finished(&api, id).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let text = format!("Deploy of api is done ({id})");
    assert_eq!(only_run(&life)["output"]["text"], text);
    let got = sink.received();
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body, json!({"text": text, "username": "kairos"}));

    // A template naming an unknown variable fails at once, posting nothing.
    let bad = "7f000000-0000-4000-8000-000000000003";
    book(
        &api,
        &plugin_point(
            bad,
            now_ms() + 1_000,
            "chat",
            json!({"webhook_url": format!("{}/x", sink.base_url()), "template": "{nope}"}),
        ),
    )
    .await;
    let life = wait_finished(&api, bad).await;
    assert_eq!(state(&life), "Stillbirth");
    assert!(only_run(&life)["error"]
        .as_str()
        .unwrap()
        .contains("`nope`"));
    assert_eq!(sink.received().len(), 1, "nothing more was posted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_fail_only_their_own_plan_and_the_host_serves_on() {
    let (_redis, sink, host, api) = start().await;
    let port = sink.addr.port();
    upload_plugin(
        &api,
        "hostile",
        "hostile",
        &format!("allowed_hosts=127.0.0.1:{port}&timeout=300ms&memory_mb=32"),
    )
    .await;
    // Allowed everywhere by its own list, so only the host's policy stands in the way.
    upload_plugin(
        &api,
        "hostile-open",
        "hostile",
        "allowed_hosts=*&timeout=2s",
    )
    .await;

    let at = now_ms() + 2_000;
    let own_api = host.url("/healthz");
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("01", "hostile", json!({"mode": "loop"}), "300 ms deadline"),
        (
            "02",
            "hostile",
            json!({"mode": "alloc"}),
            "trapped: forcing trap when growing memory",
        ),
        (
            "03",
            "hostile",
            json!({"mode": "panic"}),
            "trapped: wasm trap",
        ),
        (
            "04",
            "hostile",
            json!({"mode": "fetch", "url": own_api}),
            "outbound policy refused",
        ),
        (
            "05",
            "hostile-open",
            json!({"mode": "fetch", "url": own_api}),
            "outbound policy refused",
        ),
    ];
    for (n, plugin, input, _) in &cases {
        let id = format!("7f000000-0000-4000-8000-0000000001{n}");
        book(&api, &plugin_point(&id, at, plugin, input.clone())).await;
    }
    // Neighbours at the same moment: a webhook and a well-behaved plugin run.
    book(
        &api,
        &point(
            "7f000000-0000-4000-8000-000000000199",
            at,
            hook("neighbour"),
        ),
    )
    .await;
    let fine = "7f000000-0000-4000-8000-000000000198";
    book(
        &api,
        &plugin_point(
            fine,
            at,
            "hostile",
            json!({"mode": "fetch", "url": format!("{}/allowed", sink.base_url())}),
        ),
    )
    .await;

    for (n, _, _, expected) in &cases {
        let id = format!("7f000000-0000-4000-8000-0000000001{n}");
        let life = wait_finished(&api, &id).await;
        assert_eq!(state(&life), "Stillbirth", "{life:#}");
        let run = only_run(&life);
        let error = run["error"].as_str().unwrap_or("");
        assert!(error.contains(expected), "case {n}: `{error}`");
    }
    // The refusals say why in the run's logs: the plugin's list, then the host's policy.
    let denied = |n: &str| {
        let api = api.clone();
        let id = format!("7f000000-0000-4000-8000-0000000001{n}");
        async move { only_run(&wait_finished(&api, &id).await)["logs"].to_string() }
    };
    assert!(denied("04")
        .await
        .contains("not in this plugin's allowed_hosts"));
    assert!(denied("05").await.contains("is not on the allowlist"));
    let panic_logs = denied("03").await;
    assert!(
        panic_logs.contains("the hostile plugin panics on purpose"),
        "stderr is captured: {panic_logs}"
    );

    let life = wait_finished(&api, fine).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    assert_eq!(only_run(&life)["output"], json!({"status": 200}));
    let neighbour = wait_finished(&api, "7f000000-0000-4000-8000-000000000199").await;
    assert_eq!(state(&neighbour), "Dead");
    let paths: BTreeSet<String> = sink.received().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        BTreeSet::from(["/allowed".to_string(), "/hook".to_string()]),
        "only the allowed calls reached the sink"
    );

    // The host still serves and fires.
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
    let after = "7f000000-0000-4000-8000-000000000197";
    book(&api, &point(after, now_ms() + 800, hook("after"))).await;
    assert_eq!(state(&wait_finished(&api, after).await), "Dead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_uploads_and_unknown_plugins_are_refused_with_400() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--max-plugin-bytes", "300000")]),
    );
    let api = Api::new(&host);
    let put = |path: String, bytes: Vec<u8>| {
        let api = api.clone();
        async move {
            api.raw(
                Method::PUT,
                &path,
                bytes,
                &[("content-type", "application/wasm")],
            )
            .await
        }
    };
    let code = |r: &Value| r["error"]["code"].as_str().unwrap_or("").to_string();

    let (status, reply) = put("/plugins/bad".into(), b"not wasm at all".to_vec()).await;
    assert_eq!((status, code(&reply).as_str()), (400, "invalid_plugin"));
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("\\0asm"));
    // A core module is WebAssembly but not a component.
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let (status, reply) = put("/plugins/bad".into(), core_module).await;
    assert_eq!(
        (status, code(&reply).as_str()),
        (400, "invalid_plugin"),
        "{reply}"
    );
    // A component cut short.
    let mut cut = plugin_wasm("noop");
    cut.truncate(cut.len() / 2);
    let (status, reply) = put("/plugins/bad".into(), cut).await;
    assert_eq!(
        (status, code(&reply).as_str()),
        (400, "invalid_plugin"),
        "{reply}"
    );
    let (status, reply) = put("/plugins/Bad%20Name".into(), plugin_wasm("noop")).await;
    assert_eq!(
        (status, code(&reply).as_str()),
        (400, "invalid_plugin_name")
    );
    let (status, reply) = put("/plugins/ok?memory_mb=0".into(), plugin_wasm("noop")).await;
    assert_eq!((status, code(&reply).as_str()), (400, "invalid_query"));
    let (status, reply) = put("/plugins/ok?timeout=1h".into(), plugin_wasm("noop")).await;
    assert_eq!((status, code(&reply).as_str()), (400, "invalid_query"));
    let (status, _) = put("/plugins/big".into(), vec![0u8; 400_000]).await;
    assert_eq!(status, 413);
    // Nothing was registered by any of them.
    let (_, list) = api.get("/plugins").await;
    assert_eq!(list["plugins"], json!([]), "{list}");

    let id = "7f000000-0000-4000-8000-000000000301";
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(id, now_ms() + 60_000, "nope", json!({})),
        )
        .await;
    assert_eq!((status, code(&reply).as_str()), (400, "unknown_plugin"));
    upload_plugin(&api, "noop", "noop", "").await;
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(id, now_ms() + 60_000, "noop@2", json!({})),
        )
        .await;
    assert_eq!(
        (status, code(&reply).as_str()),
        (400, "unknown_plugin"),
        "version 2 does not exist yet"
    );
    let (status, _) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(status, 404, "a refused booking stores nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_plugin_error_is_retried_per_retry_count() {
    let (_redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "").await;

    let at = now_ms() + 1_000;
    let retried = "7f000000-0000-4000-8000-000000000401";
    let fatal = "7f000000-0000-4000-8000-000000000402";
    for (id, mode) in [(retried, "retryable"), (fatal, "no-such-mode")] {
        book(
            &api,
            &point(
                id,
                at,
                json!({"plugin": "hostile", "input": {"mode": mode},
                       "retry_count": 2, "retry_interval": "200ms"}),
            ),
        )
        .await;
    }
    let life = wait_finished(&api, retried).await;
    assert_eq!(state(&life), "Stillbirth");
    let runs = history(&life);
    let outcomes: Vec<&str> = runs
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "1 run + 2 retries: {life:#}");
    assert_eq!(outcomes.iter().filter(|o| **o == "retry").count(), 2);
    assert_eq!(outcomes.iter().filter(|o| **o == "failed").count(), 1);
    let mut started: Vec<i64> = runs
        .iter()
        .map(|r| r["started_at_ms"].as_i64().unwrap())
        .collect();
    started.sort();
    for pair in started.windows(2) {
        assert!(
            pair[1] - pair[0] >= 200,
            "retry_interval is kept: {started:?}"
        );
    }

    let life = wait_finished(&api, fatal).await;
    assert_eq!(state(&life), "Stillbirth");
    assert_eq!(
        history(&life).len(),
        1,
        "a non-retryable error is not retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_upload_is_used_by_the_next_firing_of_a_running_host() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let fast = flags(&sink, &[]);
    let firing = Host::start(&redis.url(), &fast);
    let api = Api::new(&firing);

    // Version 1 echoes its input; the firing host loads it.
    upload_plugin(&api, "swap", "hostile", "").await;
    let first = "7f000000-0000-4000-8000-000000000501";
    book(
        &api,
        &plugin_point(first, now_ms() + 800, "swap", json!({"mode": "ok"})),
    )
    .await;
    let life = wait_finished(&api, first).await;
    assert_eq!(only_run(&life)["output"]["echo"]["mode"], "ok");

    // Version 2 (noop: returns null) is uploaded through another host, which then stops.
    let mut uploader = Host::start(&redis.url(), &fast);
    let v2 = upload_plugin(&Api::new(&uploader), "swap", "noop", "").await;
    assert_eq!(v2["version"], 2);
    assert!(uploader.terminate(Duration::from_secs(10)));

    let second = "7f000000-0000-4000-8000-000000000502";
    let pinned = "7f000000-0000-4000-8000-000000000503";
    book(
        &api,
        &plugin_point(second, now_ms() + 800, "swap", json!({"mode": "ok"})),
    )
    .await;
    book(
        &api,
        &plugin_point(pinned, now_ms() + 800, "swap@1", json!({"mode": "ok"})),
    )
    .await;
    let life = wait_finished(&api, second).await;
    let run = only_run(&life);
    assert_eq!(run["host"], firing.host_id.as_str());
    assert_eq!(run["output"], Value::Null, "version 2 ran: {run:#}");
    let life = wait_finished(&api, pinned).await;
    assert_eq!(
        only_run(&life)["output"]["echo"]["mode"],
        "ok",
        "name@1 still runs version 1"
    );

    let (status, view) = api.get("/plugins/swap").await;
    assert_eq!(status, 200);
    assert_eq!(view["version"], 2);
    let versions: Vec<u64> = view["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_books_its_follow_ups_and_they_fire() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(&api, "chain", "chain", &allow_sink(&sink)).await;

    let first = "7f000000-0000-4000-8000-000000000601";
    let start = now_ms() + 1_000;
    book(
        &api,
        &plugin_point(
            first,
            start,
            "chain",
            json!({"every_seconds": 1, "times": 3,
                   "notify_url": format!("{}/step", sink.base_url())}),
        ),
    )
    .await;
    let got = sink.wait_count(3, Duration::from_secs(20)).await;
    let steps: Vec<u64> = got
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);
    for (i, r) in got.iter().enumerate() {
        assert!(
            r.at_ms >= start + 1_000 * i as i64,
            "step {} ran before its time",
            i + 1
        );
    }
    // Each step is an ordinary Life that names the next one.
    let life = wait_finished(&api, first).await;
    let second = only_run(&life)["output"]["next_life_id"]
        .as_str()
        .expect("step 1 booked step 2")
        .to_string();
    let life = wait_finished(&api, &second).await;
    let third = only_run(&life)["output"]["next_life_id"]
        .as_str()
        .unwrap()
        .to_string();
    let life = wait_finished(&api, &third).await;
    assert_eq!(state(&life), "Dead");
    assert_eq!(only_run(&life)["output"]["next_life_id"], Value::Null);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        sink.received().len(),
        3,
        "the chain stops after `times` steps"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_in_use_is_not_deleted_unless_forced() {
    let (redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "noop", "noop", "").await;
    upload_plugin(&api, "other", "noop", "").await;

    let waiting = "7f000000-0000-4000-8000-000000000701";
    book(
        &api,
        &plugin_point(waiting, now_ms() + 3_600_000, "noop", json!(null)),
    )
    .await;
    let (status, reply) = api.delete("/plugins/noop").await;
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"]["code"], "plugin_in_use");
    // Cancelled, the Life no longer holds the plugin.
    let (status, _) = api.delete(&format!("/schedules/{waiting}")).await;
    assert_eq!(status, 200);
    let (status, reply) = api.delete("/plugins/noop").await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api.get("/plugins/noop").await;
    assert_eq!(status, 404);
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(
                "7f000000-0000-4000-8000-000000000702",
                now_ms() + 60_000,
                "noop",
                json!(null),
            ),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("unknown_plugin"))
    );

    // Forced: the waiting Life stays and fails with a clear error when it fires.
    let orphan = "7f000000-0000-4000-8000-000000000703";
    book(
        &api,
        &plugin_point(orphan, now_ms() + 1_500, "other", json!(null)),
    )
    .await;
    // A Life that takes the plugin on by PATCH holds it too.
    let patched = "7f000000-0000-4000-8000-000000000704";
    book(&api, &point(patched, now_ms() + 3_600_000, hook("x"))).await;
    let (status, reply) = api
        .patch(
            &format!("/schedules/{patched}"),
            &json!({"birth": {"plugin": "other", "input": null}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api.delete("/plugins/other").await;
    assert_eq!(status, 409);
    let (status, reply) = api.delete("/plugins/other?force=true").await;
    assert_eq!(status, 200);
    assert_eq!(reply["unfinished_lives"], 2);
    let life = wait_finished(&api, orphan).await;
    assert_eq!(state(&life), "Stillbirth");
    assert!(only_run(&life)["error"]
        .as_str()
        .unwrap()
        .contains("no plugin `other` is registered"));
    // The digest the two names shared is gone with its last user.
    assert_eq!(
        redis.cli(&["--scan", "--pattern", "kairos:wasm:*"]).trim(),
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_and_queue_tasks_run_plugin_actions() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(&api, "http-forward", "http-forward", &allow_sink(&sink)).await;
    let forward = |path: &str| {
        json!({"plugin": "http-forward",
               "input": {"url": format!("{}{path}", sink.base_url()), "body": {"from": path}}})
    };

    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "nope", "schedule": "*/1 * * * * *",
                    "action": {"plugin": "missing", "input": {}}}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("unknown_plugin"))
    );
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "plug", "schedule": "*/1 * * * * *", "action": forward("/from-timer")}),
        )
        .await;
    assert!(status == 200 || status == 201, "{status} {reply}");
    let (status, reply) = api
        .post(
            "/queues/default/tasks",
            &json!({"name": "plug-1", "action": forward("/from-queue")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");

    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let got = sink.received();
        let timer_calls = got.iter().filter(|r| r.path == "/from-timer").count();
        let queue_calls = got.iter().filter(|r| r.path == "/from-queue").count();
        if timer_calls >= 2 && queue_calls == 1 {
            let body: Value =
                serde_json::from_slice(&got.iter().find(|r| r.path == "/from-queue").unwrap().body)
                    .unwrap();
            assert_eq!(body, json!({"from": "/from-queue"}));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timer calls {timer_calls}, queue calls {queue_calls}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = api.delete("/timers/plug").await;
    assert!(status == 200 || status == 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_has_no_sockets_filesystem_or_environment() {
    let (_redis, sink, _host, api) = start().await;
    // Even with the sink in its allowed_hosts, a raw socket does not reach it.
    upload_plugin(
        &api,
        "hostile",
        "hostile",
        &format!("{}&timeout=5s", allow_sink(&sink)),
    )
    .await;
    let at = now_ms() + 1_000;
    let tcp = "7f000000-0000-4000-8000-000000000981";
    let fs = "7f000000-0000-4000-8000-000000000982";
    book(
        &api,
        &plugin_point(
            tcp,
            at,
            "hostile",
            json!({"mode": "tcp", "addr": sink.addr.to_string()}),
        ),
    )
    .await;
    book(
        &api,
        &plugin_point(fs, at, "hostile", json!({"mode": "fs"})),
    )
    .await;
    let deep = "7f000000-0000-4000-8000-000000000983";
    book(
        &api,
        &plugin_point(deep, at, "hostile", json!({"mode": "recurse"})),
    )
    .await;
    let life = wait_finished(&api, tcp).await;
    let run = only_run(&life);
    assert_eq!(state(&life), "Stillbirth", "{run:#}");
    assert!(run["error"].as_str().unwrap().contains("tcp:"), "{run:#}");
    let life = wait_finished(&api, fs).await;
    assert_eq!(
        only_run(&life)["output"],
        json!({"file_ok": false, "root_ok": false, "env": []})
    );
    assert!(sink.received().is_empty());
    let life = wait_finished(&api, deep).await;
    let run = only_run(&life);
    assert_eq!(state(&life), "Stillbirth", "{run:#}");
    assert!(
        run["error"].as_str().unwrap().contains("trapped"),
        "{run:#}"
    );
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
}
