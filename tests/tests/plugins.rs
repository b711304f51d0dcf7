//! WebAssembly plugins end to end (SPEC section 7): real components built from
//! `plugins/`, uploaded over REST, fired by real hosts against a real sink.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

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

/// Uploads `plugins/…/{wasm}` to `path` and checks that it is refused with 400
/// `invalid_plugin`, a message containing `fragment`, and nothing stored under `name`.
async fn assert_upload_refused(api: &Api, name: &str, path: &str, wasm: &str, fragment: &str) {
    let (status, reply) = api.put_wasm(path, plugin_wasm(wasm)).await;
    assert_eq!(status, 400, "{reply:#}");
    assert_eq!(reply["error"]["code"], "invalid_plugin");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains(fragment),
        "{reply:#}"
    );
    let (status, _) = api.get(&format!("/plugins/{name}")).await;
    assert_eq!(status, 404);
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

/// Bytes of data (keys and values) Redis holds, from INFO memory.
fn dataset_bytes(redis: &RedisServer) -> u64 {
    let info = redis.cli(&["info", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory_dataset:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory_dataset in {info}"))
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
    // A body the SDK has whole goes out with its length, as a webhook's does.
    let length = got[0].body.len().to_string();
    assert_eq!(got[0].header("content-length"), Some(length.as_str()));
    assert_eq!(got[0].header("transfer-encoding"), None);

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
    // The well-behaved neighbour: the same component under a name of its own, whose
    // deadline is not the spinners' 300 ms (a fetch of the sink beside spinning guests
    // took 319 ms on a slow 2-core VM); starved, it would still run past it.
    upload_plugin(
        &api,
        "polite",
        "hostile",
        &format!("allowed_hosts=127.0.0.1:{port}&timeout=2s&memory_mb=32"),
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
            "panics on purpose",
        ),
        (
            "04",
            "hostile",
            json!({"mode": "fetch", "url": own_api}),
            "is not in this plugin's allowed_hosts",
        ),
        (
            "05",
            "hostile-open",
            json!({"mode": "fetch", "url": own_api}),
            "is not on the host's allowlist",
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
            "polite",
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
    assert!(denied("05")
        .await
        .contains("is not on the host's allowlist"));
    let panic_logs = denied("03").await;
    assert!(
        panic_logs.contains("the hostile plugin panics on purpose"),
        "stderr is captured: {panic_logs}"
    );
    // A panic reads as one, with its place, and without the hint to set RUST_BACKTRACE
    // (no environment reaches the sandbox).
    let panicked = only_run(&wait_finished(&api, "7f000000-0000-4000-8000-000000000103").await);
    let error = panicked["error"].as_str().unwrap_or("");
    assert!(
        error.starts_with("plugin hostile panicked at ") && error.contains("lib.rs:51:"),
        "{error}"
    );
    assert!(!panic_logs.contains("RUST_BACKTRACE"), "{panic_logs}");

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
        async move { api.put_wasm(&path, bytes).await }
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
        redis
            .cli(&["--scan", "--pattern", "kairos:{plugins}:wasm:*"])
            .trim(),
        ""
    );
}

/// The Lives that use a plugin are counted a page of a shard's `plugin-lives` set at a
/// time (SSCAN), so that a plugin with very many never holds Redis long at once: 40
/// waiting Lives among 3,000 members of Lives long gone are all counted, the gone ones
/// are forgotten, and the count took several pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_users_are_counted_page_by_page() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--shards", "1")]));
    let api = Api::new(&host);
    upload_plugin(&api, "noop", "noop", "").await;
    for i in 0..40 {
        let id = format!("7f000000-0000-4000-8000-{:012}", 900 + i);
        book(
            &api,
            &plugin_point(&id, now_ms() + 3_600_000, "noop", json!(null)),
        )
        .await;
    }
    let set = redis.cli(&["--scan", "--pattern", "kairos:{s0*}:plugin-lives:noop"]);
    let set = set.trim().trim_matches('"');
    assert!(set.starts_with("kairos:{s0"), "{set}");
    let gone: Vec<String> = (0..3_000)
        .map(|i| format!("7e000000-0000-4000-8000-{i:012}"))
        .collect();
    let mut sadd = vec!["SADD", set];
    sadd.extend(gone.iter().map(String::as_str));
    assert!(redis.cli(&sadd).contains("3000"));
    redis.cli(&["CONFIG", "RESETSTAT"]);

    let (status, plugin) = api.get("/plugins/noop").await;
    assert_eq!(status, 200, "{plugin:#}");
    assert_eq!(plugin["unfinished_lives"], 40, "{plugin:#}");
    let sscans = redis.command_calls("sscan");
    assert!(sscans >= 3, "{sscans} sscan calls");
    assert_eq!(redis.cli(&["SCARD", set]).trim(), "(integer) 40");
    let (status, list) = api.get("/plugins").await;
    assert_eq!(status, 200);
    assert_eq!(list["plugins"][0]["unfinished_lives"], 40, "{list:#}");

    // Timers are read a page at a time too: 2,500 in the shard's index, 25 of which name
    // the plugin (written straight into Redis, as many timers would be).
    let prefix = set.trim_end_matches("plugin-lives:noop");
    let mut conn = redis.conn().await;
    let mut pipe = redis::pipe();
    let mut using = Vec::new();
    for i in 0..2_500 {
        let name = format!("t{i:04}");
        pipe.zadd(format!("{prefix}timers"), &name, 0).ignore();
        let action = if i % 100 == 7 {
            using.push(name.clone());
            json!({"plugin": "noop", "input": null})
        } else {
            json!({"path": "/x"})
        };
        pipe.hset(
            format!("{prefix}timer:{name}"),
            "action",
            action.to_string(),
        )
        .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let (_, plugin) = api.get("/plugins/noop").await;
    assert_eq!(plugin["timers"], json!(using), "{plugin:#}");
    let pages = redis.command_calls("zrangebylex");
    assert!(pages >= 3, "{pages} zrangebylex calls");
    for name in &using {
        redis.cli(&["DEL", &format!("{prefix}timer:{name}")]);
        redis.cli(&["ZREM", &format!("{prefix}timers"), name]);
    }
    let (status, reply) = api.delete("/plugins/noop").await;
    assert_eq!(status, 409, "{reply:#}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("40 unfinished"),
        "{reply:#}"
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
    // A timer holds its plugin like a waiting Life does.
    let (status, reply) = api.delete("/plugins/http-forward").await;
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"]["code"], "plugin_in_use");
    let (status, _) = api.delete("/timers/plug").await;
    assert!(status == 200 || status == 204);
    let (status, reply) = api.delete("/plugins/http-forward").await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_error_message_is_bounded_in_the_history() {
    let (redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "memory_mb=64&timeout=5s").await;
    let id = "7f000000-0000-4000-8000-000000000901";
    book(
        &api,
        &plugin_point(
            id,
            now_ms() + 1_000,
            "hostile",
            json!({"mode": "big-error", "size": 4 << 20}),
        ),
    )
    .await;
    let life = wait_finished(&api, id).await;
    assert_eq!(state(&life), "Stillbirth", "{}", state(&life));
    let error = only_run(&life)["error"].as_str().unwrap().to_string();
    assert!(
        error.starts_with("plugin hostile: eeee"),
        "{}",
        &error[..40]
    );
    assert!(
        error.len() <= 4096 + 64,
        "a 4 MiB error message is kept whole: {} bytes",
        error.len()
    );
    // Nothing near the message's size reaches Redis either.
    let used = dataset_bytes(&redis);
    assert!(used < 2 << 20, "Redis holds {used} bytes of data");
}

/// One rule for timeouts: a plugin run stopped at its deadline counts as status 599, as a
/// webhook that timed out does, so it is retried when 599 is a retry code (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_timeout_is_retried_like_a_webhook_timeout() {
    let (_redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "timeout=300ms").await;
    let id = "7f000000-0000-4000-8000-000000000950";
    let body = point(
        id,
        now_ms() + 1_000,
        json!({"plugin": "hostile", "input": {"mode": "loop"}, "retry_count": 1, "retry_interval": "200ms"}),
    );
    book(&api, &body).await;
    let life = wait_finished(&api, id).await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    let runs = history(&life);
    assert_eq!(
        runs.len(),
        2,
        "the timed-out run was retried once: {runs:#?}"
    );
    for run in &runs {
        assert_eq!(run["status"], 599, "{run}");
        assert!(run["error"].as_str().unwrap().contains("deadline"), "{run}");
    }
}

/// A plugin's log lines and output cross into the host only as far as bounds allow: one
/// value is at most 16 MiB (more traps the run, with a message that says so), and a log
/// line or output within that is read only as far as the history keeps it. The 100 MB
/// line below is zero bytes the guest never wrote, so they cost no resident memory of
/// their own: copying them (as wasmtime's default 128 MiB bound would allow) would raise
/// the host's peak resident memory by 100 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_huge_log_line_or_output_is_never_copied_whole() {
    let (_redis, _sink, host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "memory_mb=512&timeout=10s").await;
    let run = |n: u32, input: Value| {
        let api = &api;
        async move {
            let id = format!("7f000000-0000-4000-8000-0000000009{n:02}");
            book(api, &plugin_point(&id, now_ms() + 1_000, "hostile", input)).await;
            wait_finished(api, &id).await
        }
    };
    // Warm-up: the plugin is compiled and the host's allocator reaches its working size.
    let life = run(10, json!({"mode": "zero-log", "size": 1000})).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let before = host.peak_rss_bytes();
    let life = run(11, json!({"mode": "zero-log", "size": 100 << 20})).await;
    let grown = host.peak_rss_bytes().saturating_sub(before);
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    let error = only_run(&life)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("too much data"), "{error}");
    assert!(
        grown < 50 << 20,
        "the host's peak memory grew by {} MiB for a 100 MB log line",
        grown >> 20
    );
    // Within the bound, a long line and a long output are cut as they are read.
    let life = run(12, json!({"mode": "zero-log", "size": 8 << 20})).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let logs = only_run(&life)["logs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let kept: usize = logs.iter().filter_map(Value::as_str).map(str::len).sum();
    assert!(kept <= 16 * 1024 + 64, "{kept} bytes of logs kept");
    let life = run(13, json!({"mode": "big-output", "size": 8 << 20})).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let output = &only_run(&life)["output"];
    assert!(
        output.to_string().len() <= 4096 + 64,
        "the output is cut to 4 KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_star_reaches_neither_the_gateway_nor_hosts_listed_only_by_the_host() {
    // The host lets webhooks reach the sink (gateway) and a second local service by
    // name; a plugin whose own list is only `*` (public hosts) must reach neither.
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let listed = Sink::start().await;
    let listed_entry = format!("127.0.0.1:{}", listed.addr.port());
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--allowed-hosts", listed_entry.as_str())]),
    );
    let api = Api::new(&host);
    upload_plugin(&api, "open", "hostile", "allowed_hosts=*&timeout=5s").await;
    // Listing the target by name is how a plugin reaches it.
    upload_plugin(
        &api,
        "named",
        "hostile",
        &format!("allowed_hosts={listed_entry}&timeout=5s"),
    )
    .await;

    let at = now_ms() + 1_500;
    let gateway = "7f000000-0000-4000-8000-000000000911";
    let internal = "7f000000-0000-4000-8000-000000000912";
    let by_name = "7f000000-0000-4000-8000-000000000913";
    let fetch = |url: String| json!({"mode": "fetch", "url": url});
    book(
        &api,
        &plugin_point(gateway, at, "open", fetch(format!("{}/g", sink.base_url()))),
    )
    .await;
    book(
        &api,
        &plugin_point(
            internal,
            at,
            "open",
            fetch(format!("{}/i", listed.base_url())),
        ),
    )
    .await;
    book(
        &api,
        &plugin_point(
            by_name,
            at,
            "named",
            fetch(format!("{}/n", listed.base_url())),
        ),
    )
    .await;
    for id in [gateway, internal] {
        let life = wait_finished(&api, id).await;
        let run = only_run(&life);
        assert_eq!(state(&life), "Stillbirth", "{run:#}");
        assert!(
            run["error"]
                .as_str()
                .unwrap_or("")
                .contains("denied by the outbound policy"),
            "{run:#}"
        );
        assert!(run["logs"].to_string().contains("denied"), "{run:#}");
    }
    let life = wait_finished(&api, by_name).await;
    assert_eq!(
        only_run(&life)["output"],
        json!({"status": 200}),
        "{life:#}"
    );
    assert!(sink.received().is_empty(), "the gateway was reached");
    let paths: Vec<String> = listed.received().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, vec!["/n".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_open_unbounded_concurrent_requests() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(
        &api,
        "hostile",
        "hostile",
        &format!("{}&timeout=20s", allow_sink(&sink)),
    )
    .await;
    sink.set_delay(Duration::from_millis(300));
    let id = "7f000000-0000-4000-8000-000000000921";
    book(
        &api,
        &plugin_point(
            id,
            now_ms() + 1_000,
            "hostile",
            json!({"mode": "flood", "url": format!("{}/flood", sink.base_url()), "n": 48}),
        ),
    )
    .await;
    let life = api
        .wait_life(id, Duration::from_secs(40), |l| {
            matches!(state(l), "Dead" | "Stillbirth")
        })
        .await;
    let run = only_run(&life);
    // Every request is served, a few at a time.
    assert_eq!(run["output"]["responses"], 48, "{run:#}");
    assert_eq!(sink.received().len(), 48);
    let most = sink.max_concurrent("");
    assert!(
        most <= 8,
        "one run had {most} requests open at once against the sink"
    );
}

/// The offset and size of the `.text` section of a 64-bit little-endian ELF file.
fn elf_text_section(elf: &[u8]) -> (usize, usize) {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..4], b"\x7fELF");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let section = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(section(shstrndx) + 0x18);
    for i in 0..shnum {
        let name_at = strtab + u32_at(section(i));
        if elf[name_at..].starts_with(b".text\0") {
            return (u64_at(section(i) + 0x18), u64_at(section(i) + 0x20));
        }
    }
    panic!("no .text section");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_compiled_plugin_cache_is_recompiled_not_run() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let data = TempDir::new("plugin-cache");
    let cache = data.0.join("plugin-cache");
    let fire = |api: Api, n: u32| async move {
        let id = format!("7f000000-0000-4000-8000-0000000009{n:02}");
        book(
            &api,
            &plugin_point(&id, now_ms() + 800, "hostile", json!({"mode": "ok"})),
        )
        .await;
        let life = wait_finished(&api, &id).await;
        assert_eq!(state(&life), "Dead", "{life:#}");
        assert_eq!(only_run(&life)["output"]["echo"]["mode"], "ok");
    };
    let meta = {
        let host = Host::start_in(&redis.url(), &flags(&sink, &[]), &data.0);
        let api = Api::new(&host);
        let meta = upload_plugin(&api, "hostile", "hostile", "timeout=5s").await;
        // The upload was compiled to be checked; the host keeps it (prepared, and in its
        // disk cache, written in the background), so that no firing compiles it again.
        let digest = meta["digest"].as_str().unwrap().to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_dir(&cache).unwrap().any(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.starts_with(&digest) && name.ends_with(".cwasm")
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "the upload left no compiled component in the cache"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        fire(api, 31).await;
        meta
    };
    let digest = meta["digest"].as_str().unwrap();
    let file = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(digest))
        .expect("the compiled component is in the cache");
    let good = std::fs::read(&file).unwrap();

    // Machine code overwritten in place (the file still parses), then a truncated file:
    // each time a new host must compile the component again and run it.
    let mut damaged = good.clone();
    let (offset, size) = elf_text_section(&good);
    assert!(size > 0);
    damaged[offset..offset + size].fill(0);
    for (n, bytes) in [(32, damaged), (33, good[..good.len() / 2].to_vec())] {
        std::fs::write(&file, &bytes).unwrap();
        let host = Host::start_in(&redis.url(), &flags(&sink, &[]), &data.0);
        let api = Api::new(&host);
        fire(api.clone(), n).await;
        let (status, _) = api.get("/healthz").await;
        assert_eq!(status, 200);
        let now = std::fs::read(&file).unwrap();
        assert_ne!(now, bytes, "the damaged file was replaced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_spec_must_be_a_valid_name_and_version_not_any_registry_key() {
    let (_redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "noop", "noop", "").await;
    // A waiting Life makes `plugin:noop:lives` (a set) exist, beside `plugin:noop:v1`.
    book(
        &api,
        &plugin_point(
            "7f000000-0000-4000-8000-000000000941",
            now_ms() + 3_600_000,
            "noop",
            json!(null),
        ),
    )
    .await;
    for (n, spec) in [
        "noop:lives",
        "noop:v1",
        "noop:lives@1",
        "",
        "@1",
        "noop@0",
        "noop@999999999999",
        "noop@",
        "NOOP",
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("7f000000-0000-4000-8000-0000000009{:02}", 50 + n);
        let (status, reply) = api
            .post(
                "/schedules",
                &plugin_point(&id, now_ms() + 60_000, spec, json!(null)),
            )
            .await;
        assert_eq!(
            (status, reply["error"]["code"].as_str()),
            (400, Some("unknown_plugin")),
            "`{spec}`: {reply}"
        );
    }
    let id = "7f000000-0000-4000-8000-000000000960";
    book(
        &api,
        &plugin_point(id, now_ms() + 1_000, "noop@1", json!(null)),
    )
    .await;
    assert_eq!(state(&wait_finished(&api, id).await), "Dead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_follow_up_booking_has_the_rest_apis_body_limit() {
    let (redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "memory_mb=128&timeout=5s").await;
    let run = |n: u32, size: usize| {
        let api = api.clone();
        async move {
            let id = format!("7f000000-0000-4000-8000-0000000009{n}");
            book(
                &api,
                &plugin_point(
                    &id,
                    now_ms() + 1_000,
                    "hostile",
                    json!({"mode": "book-big", "size": size}),
                ),
            )
            .await;
            let life = wait_finished(&api, &id).await;
            assert_eq!(state(&life), "Dead", "{life:#}");
            only_run(&life)["output"].clone()
        }
    };
    // 8 MiB of input: POST /schedules refuses such a body (413, max_body_bytes is 1 MiB
    // by default), and so does the schedule interface, rather than storing it in Redis.
    let output = run(71, 8 << 20).await;
    assert_eq!(output, json!({"code": "body_too_large"}));
    let used = dataset_bytes(&redis);
    assert!(used < 2 << 20, "Redis holds {used} bytes of data");
    // A small one is booked as before.
    let output = run(72, 100).await;
    assert!(output["booked"].is_string(), "{output}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_never_reused_after_a_delete_nor_under_concurrent_uploads() {
    let (redis, _sink, _host, api) = start().await;
    // Concurrent uploads of one name get distinct versions, each with its own record.
    let uploads: Vec<_> = (0..6)
        .map(|i| {
            let api = api.clone();
            let crate_name = if i % 2 == 0 { "noop" } else { "hostile" };
            tokio::spawn(async move { upload_plugin(&api, "x", crate_name, "").await })
        })
        .collect();
    let mut metas = Vec::new();
    for upload in uploads {
        metas.push(upload.await.unwrap());
    }
    let versions: BTreeSet<u64> = metas
        .iter()
        .map(|m| m["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=6).collect::<BTreeSet<u64>>());
    let (_, shown) = api.get("/plugins/x").await;
    for meta in &metas {
        let v = meta["version"].as_u64().unwrap() as usize;
        assert_eq!(
            shown["versions"][v - 1]["digest"],
            meta["digest"],
            "{shown:#}"
        );
    }
    // A Life pinned to version 2, left behind by a forced delete, must not run whatever
    // is uploaded next under the same number.
    let pinned = "7f000000-0000-4000-8000-000000000991";
    book(
        &api,
        &plugin_point(pinned, now_ms() + 2_500, "x@2", json!({"mode": "ok"})),
    )
    .await;
    let (status, _) = api.delete("/plugins/x?force=true").await;
    assert_eq!(status, 200);
    assert_eq!(
        redis
            .cli(&["--scan", "--pattern", "kairos:{plugins}:wasm:*"])
            .trim(),
        ""
    );
    let mut again = Vec::new();
    for _ in 0..2 {
        again.push(upload_plugin(&api, "x", "hostile", "").await);
    }
    let versions: BTreeSet<u64> = again
        .iter()
        .map(|m| m["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, BTreeSet::from([7, 8]), "{again:?}");
    let life = wait_finished(&api, pinned).await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    assert!(
        only_run(&life)["error"]
            .as_str()
            .unwrap()
            .contains("no plugin `x@2` is registered"),
        "{life:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shorter_of_the_bookings_and_the_plugins_timeout_stops_a_run_even_on_a_slow_server() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(
        &api,
        "slow-ok",
        "hostile",
        &format!("{}&timeout=10s", allow_sink(&sink)),
    )
    .await;
    upload_plugin(
        &api,
        "quick",
        "hostile",
        &format!("{}&timeout=400ms", allow_sink(&sink)),
    )
    .await;
    // The sink holds every response for 5 s: the runs wait on HTTP, not on guest code.
    sink.set_delay(Duration::from_secs(5));
    let at = now_ms() + 1_000;
    let fetch = json!({"mode": "fetch", "url": format!("{}/slow", sink.base_url())});
    let cases = [
        // The booking's timeout is the shorter one.
        (
            "7f000000-0000-4000-8000-000000000a01",
            "slow-ok",
            Some("300ms"),
            "300 ms",
        ),
        // The plugin's is.
        (
            "7f000000-0000-4000-8000-000000000a02",
            "quick",
            Some("8s"),
            "400 ms",
        ),
        (
            "7f000000-0000-4000-8000-000000000a03",
            "quick",
            None,
            "400 ms",
        ),
    ];
    for (id, plugin, timeout, _) in cases {
        let mut action = json!({"plugin": plugin, "input": fetch.clone()});
        if let Some(t) = timeout {
            action["timeout"] = json!(t);
        }
        book(&api, &point(id, at, action)).await;
    }
    for (id, _, _, deadline) in cases {
        let life = wait_finished(&api, id).await;
        let run = only_run(&life);
        assert_eq!(state(&life), "Stillbirth", "{run:#}");
        let error = run["error"].as_str().unwrap();
        assert!(
            error.contains(&format!("ran past its {deadline} deadline")),
            "{id}: {error}"
        );
        assert!(
            run["duration_ms"].as_u64().unwrap() < 2_000,
            "held past its deadline: {run:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_inject_headers_or_override_host() {
    let (_redis, sink, _host, api) = start().await;
    upload_plugin(&api, "fwd", "http-forward", &allow_sink(&sink)).await;
    let at = now_ms() + 1_000;
    let cases = [
        (
            "7f000000-0000-4000-8000-000000000b01",
            json!({"x-a": "b\r\nx-injected: 1"}),
        ),
        (
            "7f000000-0000-4000-8000-000000000b02",
            json!({"host": "internal.example"}),
        ),
        (
            "7f000000-0000-4000-8000-000000000b03",
            json!({"transfer-encoding": "chunked"}),
        ),
        (
            "7f000000-0000-4000-8000-000000000b04",
            json!({"x-a\r\nx-injected": "1"}),
        ),
    ];
    for (id, headers) in &cases {
        let input = json!({"url": format!("{}/h", sink.base_url()), "headers": headers});
        book(&api, &plugin_point(id, at, "fwd", input)).await;
    }
    for (id, _) in &cases {
        let life = wait_finished(&api, id).await;
        let run = only_run(&life);
        assert_eq!(state(&life), "Stillbirth", "{run:#}");
        assert!(run["error"].as_str().unwrap().contains("header"), "{run:#}");
    }
    assert!(sink.received().is_empty(), "{:?}", sink.received());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_books_itself_grows_linearly_not_exponentially() {
    let (redis, _sink, _host, api) = start().await;
    upload_plugin(&api, "hostile", "hostile", "timeout=5s").await;
    let started = std::time::Instant::now();
    book(
        &api,
        &plugin_point(
            "7f000000-0000-4000-8000-000000000c01",
            now_ms() + 1_000,
            "hostile",
            json!({"mode": "fork", "n": 16}),
        ),
    )
    .await;
    // Unbounded, 16 a run, this was 13,900 Lives after 8 s; at 100 a second at most
    // 1 + 100 for every second begun since.
    let mut seen = 0;
    while started.elapsed() < Duration::from_secs(7) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Every Life is in its shard's `lives` tree.
        seen = redis.count_all("lives").await as u64;
        let seconds = started.elapsed().as_secs() + 1;
        assert!(
            seen <= 1 + 100 * seconds,
            "{seen} Lives after {} ms",
            started.elapsed().as_millis()
        );
    }
    assert!(seen > 17, "the plugin did book follow-ups: {seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_keeps_the_limits_its_upload_does_not_change() {
    let (_redis, _sink, _host, api) = start().await;
    let limits = |v: &Value| {
        (
            v["version"].as_u64().unwrap(),
            v["allowed_hosts"].clone(),
            v["memory_mb"].as_u64().unwrap(),
            v["timeout_ms"].as_u64().unwrap(),
        )
    };
    let first = upload_plugin(
        &api,
        "kept",
        "noop",
        "allowed_hosts=127.0.0.1:18399&memory_mb=16&timeout=2s",
    )
    .await;
    assert_eq!(limits(&first), (1, json!(["127.0.0.1:18399"]), 16, 2_000));
    // New code, no query: the limits stay (they used to fall back to the host's
    // defaults, a 10 s timeout and no allowed hosts, without a word).
    let second = upload_plugin(&api, "kept", "noop", "").await;
    assert_eq!(limits(&second), (2, json!(["127.0.0.1:18399"]), 16, 2_000));
    // One limit changed: the others stay; an empty allowed_hosts clears the list.
    let third = upload_plugin(&api, "kept", "noop", "timeout=3s").await;
    assert_eq!(limits(&third), (3, json!(["127.0.0.1:18399"]), 16, 3_000));
    let fourth = upload_plugin(&api, "kept", "noop", "allowed_hosts=").await;
    assert_eq!(limits(&fourth), (4, json!([]), 16, 3_000));
    // What GET shows is what runs.
    let (status, view) = api.get("/plugins/kept").await;
    assert_eq!(status, 200);
    assert_eq!(limits(&view), (4, json!([]), 16, 3_000));
    // A host list with a scheme could never match a request: refused at upload.
    let (status, reply) = api
        .put_wasm(
            "/plugins/kept?allowed_hosts=http://127.0.0.1:18399",
            plugin_wasm("noop"),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_query")),
        "{reply}"
    );
}

/// A plugin uploaded through one host is prepared (compiled, cached, linked) by every
/// other host on its own, before any of its runs: its first firing there pays no
/// compilation (issue 16). Each host has a data directory of its own here, so the
/// compiled artifact in the second host's cache can only come from its own warming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_uploaded_on_one_host_is_prepared_by_the_others() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let (dir_a, dir_b) = (TempDir::new("warm-a"), TempDir::new("warm-b"));
    let a = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir_a.0);
    let b = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir_b.0);
    let meta = upload_plugin(&Api::new(&a), "fwd", "http-forward", &allow_sink(&sink)).await;
    let digest = meta["digest"].as_str().unwrap().to_string();
    let cached = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("plugin-cache"))
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&digest))
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cached(&dir_b.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the second host did not prepare the plugin: {}",
            b.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cached(&dir_a.0),
        "the uploading host keeps what it compiled"
    );
    let log = b.log_text();
    assert!(
        log.contains("plugin ready") && log.contains("plugin=fwd") && log.contains(&digest),
        "{log}"
    );
    // Nothing ran: the plugin was prepared ahead of any firing.
    assert!(sink.received().is_empty());
    // A host started later prepares it at startup, from Redis.
    let dir_c = TempDir::new("warm-c");
    let c = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir_c.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cached(&dir_c.0) {
        assert!(std::time::Instant::now() < deadline, "{}", c.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The input of the forward plugins (python-forward, js-forward): a JSON body to the
/// sink's `path`, with a header of its own.
fn forward_input(sink: &Sink, path: &str) -> Value {
    json!({
        "url": format!("{}{path}", sink.base_url()),
        "headers": {"x-custom": "yes"},
        "body": {"order": 42, "note": "né"},
    })
}

/// What the forward plugins share, checked once: `wasm` uploaded as `name`; the Life
/// `ok`, booked with an input naming the sink, fires once with its output and log line;
/// the one request the sink got has the method, path, query and headers asked for, the
/// Idempotency-Key `key(birth ms)`, and the body sent whole with its length. The
/// plugin declares its input schema: `bad_input`, without a url, is refused at booking
/// (400 `invalid_input`) and never stored.
async fn forward_fires(
    api: &Api,
    sink: &Sink,
    name: &str,
    wasm: Vec<u8>,
    ok: &str,
    bad_input: &str,
    key: impl Fn(i64) -> String,
) {
    upload_component(
        api,
        name,
        wasm,
        &format!("{}&timeout=10s", allow_sink(sink)),
    )
    .await;
    let at = now_ms() + 1_500;
    let input = forward_input(sink, "/forwarded?x=1");
    book(api, &plugin_point(ok, at, name, input)).await;
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(bad_input, at, name, json!({"body": {}})),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    assert_eq!(reply["error"]["code"], "invalid_input", "{reply:#}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"url\" is a required property"),
        "{reply:#}"
    );
    let (status, _) = api.get(&format!("/schedules/{bad_input}")).await;
    assert_eq!(status, 404, "a refused booking stores nothing");

    let life = wait_finished(api, ok).await;
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
    assert_eq!(
        (call.method.as_str(), call.path.as_str()),
        ("POST", "/forwarded")
    );
    assert_eq!(call.query.as_deref(), Some("x=1"));
    assert_eq!(call.header("x-custom"), Some("yes"));
    assert_eq!(call.header("x-kairos-life"), Some(ok));
    assert_eq!(call.header("idempotency-key"), Some(key(at).as_str()));
    assert_eq!(call.header("content-type"), Some("application/json"));
    // Sent whole, with its length, as the Rust SDK and a webhook do.
    assert_eq!(
        call.header("content-length"),
        Some(call.body.len().to_string().as_str())
    );
    assert_eq!(call.header("transfer-encoding"), None);
    let body: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(body, json!({"order": 42, "note": "né"}));
    assert!(call.at_ms >= at, "ran {} ms early", at - call.at_ms);
}

/// A Python plugin (`plugins/python-forward`, built with componentize-py against
/// `wit/` and the SDK in `guest-sdk/python`) uploaded, booked and fired like a Rust one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_forwards_its_input_refuses_unfit_input_and_fails_refusals_for_good() {
    let (_redis, sink, _host, api) = start().await;
    let ok = "7f000000-0000-4000-8000-0000000000a1";
    let bad_input = "7f000000-0000-4000-8000-0000000000a2";
    let refused = "7f000000-0000-4000-8000-0000000000a3";
    // python-forward sets its own key: the Life and the Plan's time.
    let wasm = python_plugin_wasm("forward");
    forward_fires(&api, &sink, "py-forward", wasm, ok, bad_input, |at| {
        format!("{ok}:{at}")
    })
    .await;

    // A 404 is `Error.fatal`: one run, no retry, though the action allows three.
    sink.answer(&[404]);
    let mut action = plugin_point(
        refused,
        now_ms() + 1_000,
        "py-forward",
        forward_input(&sink, "/gone"),
    );
    action["birth"]["retry_count"] = json!(3);
    action["birth"]["retry_interval"] = json!(1);
    book(&api, &action).await;
    let life = wait_finished(&api, refused).await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    let error = only_run(&life)["error"].as_str().unwrap().to_string();
    assert!(error.contains("/gone answered 404"), "{error}");
    assert_eq!(sink.received().len(), 2);
}

/// A JavaScript plugin (plugins/js-forward, built with componentize-js) end to end: its
/// request as the sink sees it, an input its declared schema refuses at booking,
/// a 503 retried (a retryable PluginError) until it succeeds, and a host its
/// allowed_hosts do not list refused, with the refusal in the run's logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_plugin_forwards_retries_and_refuses_unfit_input_at_booking() {
    let (_redis, sink, _host, api) = start().await;
    let ok = "7f000000-0000-4000-8000-0000000000b1";
    let bad_input = "7f000000-0000-4000-8000-0000000000b2";
    // js-forward sets none: the SDK sends the key a webhook of the same Plan would.
    let wasm = js_plugin_wasm("forward");
    forward_fires(&api, &sink, "js-forward", wasm, ok, bad_input, |_| {
        format!("{ok}:birth")
    })
    .await;

    // A 503 is a retryable PluginError: run again, and the second run succeeds.
    sink.answer(&[503]);
    let retried = "7f000000-0000-4000-8000-0000000000b3";
    let mut action = plugin_point(
        retried,
        now_ms() + 1_000,
        "js-forward",
        forward_input(&sink, "/busy"),
    );
    action["birth"]["retry_count"] = json!(2);
    action["birth"]["retry_interval"] = json!(1);
    book(&api, &action).await;
    let life = wait_finished(&api, retried).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let busy: Vec<_> = sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/busy")
        .collect();
    assert_eq!(busy.len(), 2, "one retry after the 503");

    // A host the plugin may not call: refused by the sandbox, the refusal logged.
    let denied = "7f000000-0000-4000-8000-0000000000b4";
    let elsewhere = json!({"url": "http://127.0.0.1:9/nowhere"});
    book(
        &api,
        &plugin_point(denied, now_ms() + 1_000, "js-forward", elsewhere),
    )
    .await;
    let life = wait_finished(&api, denied).await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    let run = only_run(&life);
    let logs: Vec<String> = serde_json::from_value(run["logs"].clone()).unwrap();
    assert!(
        logs.iter()
            .any(|l| l.contains("denied") && l.contains("not in this plugin's allowed_hosts")),
        "{run:#}"
    );
}

/// A plugin that declares its input's JSON Schema (WIT 0.2 `input-schema`; http-forward
/// derives it from its `Input` type) has every booking, timer, queue task and change
/// checked against it: one that does not fit is a 400 `invalid_input` naming the JSON
/// path, and nothing of it is stored. A schema that is not JSON Schema, or is over 64 KiB,
/// fails the upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_that_does_not_fit_the_plugins_schema_is_refused_at_booking_and_stores_nothing() {
    let (redis, sink, _host, api) = start().await;
    let meta = upload_plugin(&api, "http-forward", "http-forward", &allow_sink(&sink)).await;
    assert_eq!(meta["input_schema"]["required"], json!(["url"]), "{meta:#}");
    let (_, shown) = api.get("/plugins/http-forward").await;
    assert_eq!(
        shown["input_schema"]["properties"]["url"]["type"], "string",
        "{shown:#}"
    );
    let refused = |reply: &Value, needle: &str| {
        assert_eq!(reply["error"]["code"], "invalid_input", "{reply:#}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message}");
        assert!(message.contains("`http-forward`"), "{message}");
    };
    let keys_before = redis.cli(&["dbsize"]);

    let id = "7f000000-0000-4000-8000-000000000e01";
    let at = now_ms() + 60_000;
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(id, at, "http-forward", json!({"body": {}})),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "birth.input does not fit");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"url\" is a required property"),
        "{reply:#}"
    );
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(id, at, "http-forward", json!({"url": 5})),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "birth.input at /url");
    // A term's end action is checked as well, by its own name.
    let good = json!({"plugin": "http-forward", "input": {"url": sink.base_url()}});
    let unfit_death =
        json!({"plugin": "http-forward", "input": {"url": sink.base_url(), "headers": {"x": 1}}});
    let term = term(id, at, at + 600_000, good, unfit_death);
    let (status, reply) = api.post("/schedules", &term).await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "death.input at /headers/x");
    let (status, _) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(status, 404, "a refused booking stores nothing");

    // Timers and queue tasks too.
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "unfit", "schedule": "*/5 * * * * *",
                    "action": {"plugin": "http-forward", "input": {"url": []}}}),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "at /url");
    let (status, _) = api.get("/timers/unfit").await;
    assert_eq!(status, 404);
    let (status, reply) = api
        .post(
            "/queues/default/tasks",
            &json!({"name": "unfit-1",
                    "action": {"plugin": "http-forward", "input": {"method": "POST"}}}),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "is a required property");
    let (status, _) = api.get("/queues/default/tasks/unfit-1").await;
    assert_eq!(status, 404);
    assert_eq!(
        redis.cli(&["dbsize"]),
        keys_before,
        "a refused input wrote a key"
    );

    // A fitting booking is taken; a change that breaks its input is refused and the
    // Life stays as it was.
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(id, at, "http-forward", json!({"url": sink.base_url()})),
        )
        .await;
    assert_eq!(status, 200, "{reply:#}");
    let (status, reply) = api
        .patch(
            &format!("/schedules/{id}"),
            &json!({"birth": {"plugin": "http-forward", "input": {"url": false}}}),
        )
        .await;
    assert_eq!(status, 400, "{reply:#}");
    refused(&reply, "birth.input at /url");
    let (_, life) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(
        life["plans"][0]["action"]["input"],
        json!({"url": sink.base_url()}),
        "{life:#}"
    );

    // A declared schema that is not JSON Schema: the upload is refused, nothing stored.
    assert_upload_refused(
        &api,
        "bad-schema",
        "/plugins/bad-schema",
        "bad-schema",
        "input-schema is not a usable JSON Schema",
    )
    .await;
    // Nor one larger than 64 KiB, which every booking would have to be checked against.
    assert_upload_refused(
        &api,
        "huge-schema",
        "/plugins/huge-schema",
        "huge-schema",
        "more than the 65536 allowed",
    )
    .await;
}

/// A component whose `input-schema` export never returns (`plugins/testing/slow-schema`
/// spins) is stopped after the 5 s bound on that call, though its upload asks for a
/// 10 s `timeout`, and refused; nothing is stored and the host serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_input_schema_never_answers_is_stopped_after_5_s_and_refused() {
    let (_redis, _sink, _host, api) = start().await;
    let began = std::time::Instant::now();
    assert_upload_refused(
        &api,
        "slow-schema",
        "/plugins/slow-schema?timeout=10s",
        "slow-schema",
        "its input-schema export failed: plugin upload ran past its 5000 ms deadline",
    )
    .await;
    // Stopped at the 5 s bound, not at the upload's 10 s (the 404 check after it is
    // one quick GET).
    let took = began.elapsed();
    assert!(took >= Duration::from_secs(5), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (status, plugins) = api.get("/plugins").await;
    assert_eq!(status, 200, "{plugins:#}");
    assert_eq!(plugins["plugins"], json!([]), "{plugins:#}");
}

/// A component built for version 0.1.0 of the WIT package (no `input-schema` export,
/// `plugins/testing/legacy-v01`, made with wit-bindgen directly) still uploads, takes any
/// input, and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_for_wit_0_1_still_uploads_and_runs() {
    let (_redis, _sink, _host, api) = start().await;
    let meta = upload_plugin(&api, "legacy", "legacy-v01", "").await;
    assert!(meta.get("input_schema").is_none(), "{meta:#}");
    let id = "7f000000-0000-4000-8000-000000000e11";
    let input = json!({"anything": [1, "two"]});
    book(
        &api,
        &plugin_point(id, now_ms() + 1_000, "legacy", input.clone()),
    )
    .await;
    let life = wait_finished(&api, id).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    assert_eq!(
        only_run(&life)["output"],
        json!({ "v01": input }),
        "{life:#}"
    );
}

/// Compiled code is reused by digest (issue 30): the same bytes uploaded under a second
/// name, or again after the host restarts, are not compiled again (the host says where
/// the code came from: held prepared, or its disk cache), and each name fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bytes_under_another_name_or_after_a_restart_are_not_compiled_again() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let dir = TempDir::new("reuse-compiled");
    let mut host = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir.0);
    let uploaded = |host: &Host, name: &str| {
        host.log_text()
            .lines()
            .find(|l| l.contains("plugin uploaded") && l.contains(&format!("plugin={name} ")))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no upload of {name} logged: {}", host.log_text()))
    };
    let api = Api::new(&host);
    let first = upload_plugin(&api, "fwd-a", "http-forward", &allow_sink(&sink)).await;
    assert!(uploaded(&host, "fwd-a").contains("code=\"compiled\""));
    let second = upload_plugin(&api, "fwd-b", "http-forward", &allow_sink(&sink)).await;
    assert_eq!(first["digest"], second["digest"]);
    assert!(
        uploaded(&host, "fwd-b").contains("code=\"resident\""),
        "{}",
        uploaded(&host, "fwd-b")
    );
    // Its artifact reaches the disk cache in the background.
    let digest = first["digest"].as_str().unwrap().to_string();
    let cached = || {
        std::fs::read_dir(dir.0.join("plugin-cache"))
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(&digest) && name.ends_with(".cwasm")
                })
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cached() {
        assert!(std::time::Instant::now() < deadline, "no artifact written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A restart over the same data directory: loaded from the disk cache.
    host.kill9();
    let host = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir.0);
    let api = Api::new(&host);
    upload_plugin(&api, "fwd-c", "http-forward", &allow_sink(&sink)).await;
    let line = uploaded(&host, "fwd-c");
    assert!(
        line.contains("code=\"disk_cache\"") || line.contains("code=\"resident\""),
        "{line}"
    );
    assert!(!line.contains("code=\"compiled\""), "{line}");

    // Every name runs.
    let at = now_ms() + 1_000;
    let ids = [
        "7f000000-0000-4000-8000-00000000d001",
        "7f000000-0000-4000-8000-00000000d002",
        "7f000000-0000-4000-8000-00000000d003",
    ];
    for (id, name) in ids.iter().zip(["fwd-a", "fwd-b", "fwd-c"]) {
        let input = json!({"url": format!("{}/{name}", sink.base_url())});
        book(&api, &plugin_point(id, at, name, input)).await;
    }
    for id in ids {
        let life = wait_finished(&api, id).await;
        assert_eq!(state(&life), "Dead", "{life:#}");
    }
    assert_eq!(sink.received().len(), 3);
}

/// A large component (the 13 MB JavaScript one) is answered at once, 202 `compiling`,
/// and compiles in the background: the version before stays what the name runs until
/// the new one is ready, a booking naming the new one waits for it and is checked
/// against the schema it declares, and when the uploading host dies mid-compile another
/// host ends the compile (issue 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_component_answers_at_once_and_compiles_in_the_background() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // Data directories of their own: no compiled artifact from another test to reuse.
    let (dir_a, dir_b) = (TempDir::new("compile-a"), TempDir::new("compile-b"));
    let mut uploader = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir_a.0);
    let other = Host::start_in(&redis.url(), &flags(&sink, &[]), &dir_b.0);
    let (up, api) = (Api::new(&uploader), Api::new(&other));
    let query = format!("{}&timeout=10s", allow_sink(&sink));

    let first = upload_plugin(&up, "swap", "noop", &query).await;
    assert_eq!(
        (first["version"].as_u64(), first["state"].as_str()),
        (Some(1), Some("ready"))
    );
    let started = Instant::now();
    let (status, second) = up
        .put_wasm(&format!("/plugins/swap?{query}"), js_plugin_wasm("forward"))
        .await;
    let answered = started.elapsed();
    assert_eq!(
        (status, second["state"].as_str(), second["version"].as_u64()),
        (202, Some("compiling"), Some(2)),
        "{second:#}"
    );
    // Answered before the compile ended (`compiling` says so), and without waiting for
    // it: the upload waits 1 s for a large component, the rest is sending 13 MB to a
    // debug build (6 s on a slow 2-core VM, where the compile takes far longer).
    assert!(
        answered < Duration::from_secs(15),
        "answered after {answered:?}"
    );
    assert!(second.get("input_schema").is_none(), "{second:#}");
    uploader.kill9();

    // Visible while it compiles: the newest version is compiling, the one before ready.
    let (status, shown) = api.get("/plugins/swap").await;
    assert_eq!(status, 200, "{shown:#}");
    let states: Vec<&str> = shown["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["state"].as_str().unwrap())
        .collect();
    assert_eq!(states[0], "ready", "{shown:#}");
    assert!(["compiling", "ready"].contains(&states[1]), "{shown:#}");

    // Naming the new version waits for its compile, then checks its declared schema.
    let waited = Instant::now();
    let unfit = json!({"body": {}});
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(
                "7f000000-0000-4000-8000-0000000000c1",
                now_ms() + 600_000,
                "swap@2",
                unfit.clone(),
            ),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_input")),
        "after {:?}: {reply:#}",
        waited.elapsed()
    );
    // The other host ended the compile: version 2 is ready and the latest.
    let (_, shown) = api.get("/plugins/swap").await;
    assert_eq!(
        (shown["version"].as_u64(), shown["state"].as_str()),
        (Some(2), Some("ready")),
        "{shown:#}"
    );
    assert!(shown["input_schema"].is_object(), "{shown:#}");
    // `swap` now names version 2: the input noop took is refused, a fit one fires.
    let (status, reply) = api
        .post(
            "/schedules",
            &plugin_point(
                "7f000000-0000-4000-8000-0000000000c2",
                now_ms() + 600_000,
                "swap",
                unfit,
            ),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_input")),
        "{reply:#}"
    );
    let ok = "7f000000-0000-4000-8000-0000000000c3";
    book(
        &api,
        &plugin_point(
            ok,
            now_ms() + 1_500,
            "swap",
            forward_input(&sink, "/after-compile"),
        ),
    )
    .await;
    let life = wait_finished(&api, ok).await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    assert_eq!(
        sink.received()
            .iter()
            .filter(|r| r.path == "/after-compile")
            .count(),
        1
    );

    // The CLI waits for the compile by default: it prints the version once ready.
    let dir = TempDir::new("compile-cli");
    let file = dir.0.join("python_forward.wasm");
    std::fs::write(&file, python_plugin_wasm("forward")).unwrap();
    let server = format!("http://{}", other.addr);
    let (code, out, err) = kairos_command(&[
        "--server",
        &server,
        "-o",
        "json",
        "plugins",
        "upload",
        "py-late",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("compiling on the server"), "{err}");
    let meta: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(meta["state"], "ready", "{out}");
    assert!(meta["input_schema"].is_object(), "{out}");
}
