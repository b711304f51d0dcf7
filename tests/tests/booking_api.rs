//! The booking REST API against a real redis-server and a real kairos process: every row
//! of the validation table (SPEC section 2), every route, token scopes, and both time
//! formats in a non-UTC zone.

use std::time::Duration;

use axum::http::Method;
use kairos_e2e::{fast_flags, flags_with, Api, Host, RedisServer};
use redis::AsyncCommands;
use serde_json::{json, Value};

fn flags(extra: &[&str]) -> Vec<String> {
    let pairs: Vec<(&str, &str)> = extra.chunks(2).map(|p| (p[0], p[1])).collect();
    let mut f = flags_with(fast_flags(), &pairs);
    f.extend(
        ["--gateway-url", "http://127.0.0.1:9"]
            .iter()
            .map(|s| s.to_string()),
    );
    f
}

fn hook() -> Value {
    json!({"path": "/hook", "method": "POST", "body": {"id": "a0"}})
}

fn point(id: &str, birth: &str) -> Value {
    json!({"life_uuid": id, "schedule_type": "point", "birth_time": birth, "birth": hook()})
}

fn term(id: &str, resource: &str, birth: &str, death: &str) -> Value {
    json!({"life_uuid": id, "schedule_type": "term", "resource_id": resource,
           "term": {"birth_time": birth, "death_time": death}, "birth": hook(), "death": hook()})
}

fn code(reply: &(u16, Value)) -> (u16, &str) {
    (
        reply.0,
        reply.1["error"]["code"]
            .as_str()
            .unwrap_or("<no error body>"),
    )
}

async fn key_count(redis: &RedisServer) -> usize {
    redis.booked_keys().await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_validation_table_refuses_and_stores_nothing() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis.url(),
        &flags(&[
            "--execution-delay-guard-time",
            "60m",
            "--minimum-life-term",
            "3m",
            "--execution-guard-time",
            "30s",
            "--max-body-bytes",
            "4096",
        ]),
    );
    let api = Api::new(&host);

    // 400: not JSON, wrong shape, missing fields, unparsable times, unknown plugin.
    let r = api
        .raw(Method::POST, "/schedules", b"{not json".to_vec(), &[])
        .await;
    assert_eq!(code(&r), (400, "invalid_json"));
    assert!(r.1["error"]["message"].as_str().unwrap().contains("JSON"));
    assert_eq!(
        code(&api.post("/schedules", &json!([1, 2])).await),
        (400, "invalid_body")
    );
    assert_eq!(
        code(&api.post("/schedules", &json!({"birth": hook()})).await),
        (400, "missing_field")
    );
    assert_eq!(
        code(
            &api.post("/schedules", &json!({"birth_time": "2030-01-01 00:00:00"}))
                .await
        ),
        (400, "missing_field")
    );
    assert_eq!(
        code(&api.post("/schedules", &point("t1", "next tuesday")).await),
        (400, "invalid_time")
    );
    assert_eq!(
        code(&api.post("/schedules", &json!({"birth_time": "2030-01-01 00:00:00", "birth": {"plugin": "nope", "input": {}}})).await),
        (400, "unknown_plugin")
    );
    assert_eq!(
        code(
            &api.post(
                "/schedules",
                &json!({"birth_time": "2030-01-01 00:00:00", "birth": {"path": "/x"}})
            )
            .await
        ),
        (400, "invalid_action")
    );
    // 400: birth >= death, then birth + minimum_life_term > death.
    assert_eq!(
        code(
            &api.post(
                "/schedules",
                &term("t2", "r", "2030-01-01 00:10:00", "2030-01-01 00:10:00")
            )
            .await
        ),
        (400, "birth_not_before_death")
    );
    assert_eq!(
        code(
            &api.post(
                "/schedules",
                &term("t3", "r", "2030-01-01 00:10:00", "2030-01-01 00:12:59")
            )
            .await
        ),
        (400, "term_too_short")
    );
    // 406: closer than execution_guard_time (30 s) to now.
    let soon = kairos_e2e::at_ms_from_now(20_000);
    assert_eq!(
        code(&api.post("/schedules", &point("t4", &soon)).await),
        (406, "too_soon")
    );
    // 413: larger than max_body_bytes.
    let mut big = point("t5", "2030-01-01 00:00:00");
    big["birth"]["body"] = json!("x".repeat(5000));
    assert_eq!(
        code(&api.post("/schedules", &big).await),
        (413, "body_too_large")
    );

    assert_eq!(
        key_count(&redis).await,
        0,
        "a refused booking must leave nothing in Redis"
    );

    // 409: overlap on a resource within execution_delay_guard_time (60 min), then a
    // duplicate life_uuid.
    let ok = api
        .post(
            "/schedules",
            &term(
                "t6",
                "conn-42",
                "2030-01-01 10:00:00",
                "2030-01-01 11:00:00",
            ),
        )
        .await;
    assert_eq!(ok.0, 200, "{}", ok.1);
    let before = key_count(&redis).await;
    let r = api
        .post(
            "/schedules",
            &term(
                "t7",
                "conn-42",
                "2030-01-01 11:59:00",
                "2030-01-01 12:30:00",
            ),
        )
        .await;
    assert_eq!(code(&r), (409, "resource_conflict"));
    assert!(r.1["error"]["message"].as_str().unwrap().contains("t6"));
    // Just outside the guard on the other side is fine.
    let r = api
        .post(
            "/schedules",
            &term(
                "t8",
                "conn-42",
                "2030-01-01 12:00:01",
                "2030-01-01 12:30:00",
            ),
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    let r = api
        .post("/schedules", &point("t6", "2031-01-01 00:00:00"))
        .await;
    assert_eq!(code(&r), (409, "duplicate_life_uuid"));
    // `batch` would be booked and then shadowed by `POST /schedules/batch`: no GET,
    // PATCH or DELETE could reach it.
    let r = api
        .post("/schedules", &point("batch", "2031-01-01 00:00:00"))
        .await;
    assert_eq!(code(&r), (400, "invalid_life_uuid"), "{}", r.1);
    assert!(r.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("reserved"));
    // The original t6 is untouched by the refused duplicate.
    let (_, t6) = api.get("/schedules/t6").await;
    assert_eq!(t6["schedule_type"], "term");
    // A Life whose resource puts it in another shard than its id's leaves a pointer in
    // its id's home shard.
    let ks = redis.keyspace().await;
    let pointer = usize::from(ks.life("t8").index != ks.resource("conn-42").index);
    assert_eq!(
        key_count(&redis).await,
        before + pointer,
        "t8 adds no key but a pointer to its shard: its record goes into the bucket that holds t6's, its birth into the trees t6 made; the refusals add nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_book_list_show_patch_and_cancel() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);

    assert_eq!(api.get("/healthz").await, (200, json!({"status": "ok"})));
    assert_eq!(api.get("/readyz").await.0, 200);

    // A generated id is 32 hex characters.
    let (status, booked) = api
        .post(
            "/schedules",
            &json!({"birth_time": "2030-01-01 00:00:00", "birth_action": hook()}),
        )
        .await;
    assert_eq!(status, 200, "{booked}");
    let generated = booked["life_uuid"].as_str().unwrap().to_string();
    assert_eq!(generated.len(), 32);
    assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(booked["birth_time"], "2030-01-01T00:00:00Z");
    assert_eq!(booked["birth_time_ms"], 1_893_456_000_000i64);

    for (i, day) in ["02", "03", "04", "05", "06"].iter().enumerate() {
        let resource = if i % 2 == 0 { "even" } else { "odd" };
        let r = api
            .post(
                "/schedules",
                &term(
                    &format!("l{i}"),
                    resource,
                    &format!("2030-01-{day} 00:00:00"),
                    &format!("2030-01-{day} 01:00:00"),
                ),
            )
            .await;
        assert_eq!(r.0, 200, "{}", r.1);
    }

    // Pagination walks every Life once, in birth order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/schedules?limit=2&cursor={c}"),
            None => "/schedules?limit=2".into(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        assert!(page["items"].as_array().unwrap().len() <= 2);
        for item in page["items"].as_array().unwrap() {
            seen.push(item["life_uuid"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        vec![
            generated.clone(),
            "l0".into(),
            "l1".into(),
            "l2".into(),
            "l3".into(),
            "l4".into()
        ]
    );

    // Filters.
    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["life_uuid"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, even) = api.get("/schedules?resource_id=even").await;
    assert_eq!(ids(&even), vec!["l0", "l2", "l4"]);
    let (_, window) = api
        .get("/schedules?from=2030-01-03%2000:00:00&to=2030-01-04T00:00:00Z")
        .await;
    assert_eq!(ids(&window), vec!["l1", "l2"]);
    let (_, none_dead) = api.get("/schedules?state=Dead").await;
    assert!(ids(&none_dead).is_empty());
    let (_, pending) = api.get("/schedules?state=Inexistent&resource_id=odd").await;
    assert_eq!(ids(&pending), vec!["l1", "l3"]);
    assert_eq!(
        code(&api.get("/schedules?state=Sleeping").await),
        (400, "invalid_query")
    );
    assert_eq!(
        code(&api.get("/schedules?limit=0").await),
        (400, "invalid_query")
    );

    // Show.
    let (status, l0) = api.get("/schedules/l0").await;
    assert_eq!(status, 200);
    assert_eq!(l0["state"], "Inexistent");
    assert_eq!(l0["resource_id"], "even");
    let plans = l0["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 2);
    assert_eq!(plans[0]["kind"], "birth");
    assert_eq!(plans[0]["state"], "Standby");
    assert_eq!(plans[0]["attempts"], 0);
    assert_eq!(plans[0]["action"]["path"], "/hook");
    assert_eq!(plans[1]["kind"], "death");
    assert_eq!(code(&api.get("/schedules/nope").await), (404, "not_found"));

    // Patch: move the death by an hour; the Plan and the Life follow, Redis too.
    let (status, moved) = api
        .patch(
            "/schedules/l0",
            &json!({"death_time": "2030-01-02 02:00:00"}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["death_time"], "2030-01-02T02:00:00Z");
    assert_eq!(moved["plans"][1]["fire_at_ms"], 1_893_549_600_000i64);
    let ks = redis.keyspace().await;
    let even = ks.resource("even");
    let fire = redis.plan_field(even, "l0:death", "fire_at_ms").await;
    assert_eq!(fire.as_deref(), Some("1893549600000"));
    // Moving the birth re-scores the due set.
    let (status, _) = api
        .patch(
            "/schedules/l0",
            &json!({"birth_time": "2030-01-02 00:30:00"}),
        )
        .await;
    assert_eq!(status, 200);
    let score = redis.tree_score(&even.due(), "l0:birth").await;
    assert_eq!(score, Some(1_893_544_200_000));
    // A patch is validated as a whole: this one would make the term too short.
    assert_eq!(
        code(
            &api.patch(
                "/schedules/l0",
                &json!({"death_time": "2030-01-02 00:30:00.500"})
            )
            .await
        ),
        (400, "term_too_short")
    );
    // ...and checked against other bookings of the resource.
    assert_eq!(
        code(
            &api.patch(
                "/schedules/l0",
                &json!({"death_time": "2030-01-04 00:00:00"})
            )
            .await
        ),
        (409, "resource_conflict")
    );
    assert_eq!(
        code(&api.patch("/schedules/nope", &json!({})).await),
        (404, "not_found")
    );

    // Cancel before birth: Stillbirth, the birth is out of the due set.
    let (status, cancelled) = api.delete("/schedules/l1").await;
    assert_eq!(
        (status, cancelled["state"].as_str()),
        (200, Some("Stillbirth"))
    );
    let gone = redis
        .tree_score(&ks.resource("odd").due(), "l1:birth")
        .await;
    assert_eq!(gone, None);
    let (_, l1) = api.get("/schedules/l1").await;
    assert_eq!(l1["plans"][0]["state"], "Cancelled");
    assert_eq!(l1["plans"][1]["state"], "Cancelled");
    // A finished Life cannot be cancelled or changed again.
    assert_eq!(
        code(&api.delete("/schedules/l1").await),
        (409, "life_finished")
    );
    // The table's order holds for PATCH too: the body's own errors (400) come first.
    assert_eq!(
        code(
            &api.patch(
                "/schedules/l1",
                &json!({"birth_time": "2030-02-01 00:00:00"})
            )
            .await
        ),
        (400, "birth_not_before_death")
    );
    assert_eq!(
        code(
            &api.patch(
                "/schedules/l1",
                &json!({"birth_time": "2030-01-03 00:30:00"})
            )
            .await
        ),
        (409, "life_finished")
    );
    assert_eq!(
        code(&api.delete("/schedules/nope").await),
        (404, "not_found")
    );
    // A cancelled Life no longer holds its resource.
    let r = api
        .post(
            "/schedules",
            &term("l1b", "odd", "2030-01-03 00:00:00", "2030-01-03 01:00:00"),
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);

    assert_eq!(code(&api.get("/nowhere").await), (404, "not_found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_scopes() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis.url(),
        &flags(&["--api-tokens", "r3ad:read,b00k:book,adm1n:admin"]),
    );
    let anon = Api::new(&host);
    let reader = anon.with_token("r3ad");
    let booker = anon.with_token("b00k");
    let admin = anon.with_token("adm1n");

    assert_eq!(anon.get("/healthz").await.0, 200, "healthz needs no token");
    assert_eq!(code(&anon.get("/schedules").await), (401, "unauthorized"));
    assert_eq!(
        anon.get("/readyz").await.0,
        200,
        "readyz needs no token (Kubernetes probes send none)"
    );
    assert_eq!(
        code(&anon.with_token("guess").get("/schedules").await),
        (401, "unauthorized")
    );
    assert_eq!(reader.get("/schedules").await.0, 200);
    let r = reader
        .post("/schedules", &point("s1", "2030-01-01 00:00:00"))
        .await;
    assert_eq!(code(&r), (403, "forbidden"));
    assert_eq!(
        booker
            .post("/schedules", &point("s1", "2030-01-01 00:00:00"))
            .await
            .0,
        200
    );
    assert_eq!(
        booker.get("/schedules/s1").await.0,
        200,
        "book implies read"
    );
    assert_eq!(
        code(&reader.delete("/schedules/s1").await),
        (403, "forbidden")
    );
    assert_eq!(
        admin.delete("/schedules/s1").await.0,
        200,
        "admin implies book"
    );
    assert_eq!(
        code(
            &booker
                .raw(Method::PUT, "/plugins/x", b"\0asm".to_vec(), &[])
                .await
        ),
        (403, "forbidden")
    );
    // Each answer names the scope its token was granted, for clients that show what a
    // token may not do (the dashboard disables those buttons).
    for (token, scope) in [("r3ad", "read"), ("b00k", "book"), ("adm1n", "admin")] {
        let exchange = http_exchange(&host, "/schedules", Some(&format!("Bearer {token}")))
            .to_ascii_lowercase();
        assert!(
            exchange.contains(&format!("\r\nx-kairos-scope: {scope}\r\n")),
            "{exchange}"
        );
    }
    let refused = http_exchange(&host, "/schedules", None).to_ascii_lowercase();
    assert!(!refused.contains("x-kairos-scope"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_an_open_non_loopback_listen_without_tokens() {
    let redis = RedisServer::start();
    let out = std::process::Command::new(kairos_e2e::kairos_bin())
        .args([
            "serve",
            "--redis-url",
            &redis.url(),
            "--listen",
            "0.0.0.0:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--insecure") && stderr.contains("--api-tokens"),
        "{stderr}"
    );
}

/// Every change is in the audit log with the name of the token that made it (or a
/// fingerprint, never the secret), its route and its answer; refused tokens too; reads
/// are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_audited_with_the_tokens_name() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis.url(),
        &flags(&["--api-tokens", "deployer@b00k-s3cret:book,r3ad-s3cret:read"]),
    );
    let api = Api::new(&host);
    let booker = api.with_token("b00k-s3cret");
    let reader = api.with_token("r3ad-s3cret");
    // The caller's request id is kept and answered; without one the host makes one.
    let (status, headers, _) = booker
        .call(
            Method::POST,
            "/schedules",
            serde_json::to_vec(&point("audited", "2030-01-01 00:00:00")).unwrap(),
            &[("x-request-id", "trace-abc-1")],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-request-id"], "trace-abc-1");
    let (status, headers, _) = reader
        .call(Method::GET, "/schedules/audited", Vec::new(), &[])
        .await;
    assert_eq!(status, 200);
    let made = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(made.len(), 16, "{made}");
    assert_eq!(
        code(&reader.delete("/schedules/audited").await),
        (403, "forbidden")
    );
    assert_eq!(api.with_token("guess").get("/schedules").await.0, 401);
    let (status, headers, _) = booker
        .call(Method::DELETE, "/schedules/audited", Vec::new(), &[])
        .await;
    assert_eq!(status, 200);
    let delete_id = headers["x-request-id"].to_str().unwrap().to_string();
    assert_ne!(delete_id, made, "each request has its own id");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let audit = loop {
        let log = host.log_text();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("kairos::audit"))
            .map(str::to_string)
            .collect();
        if lines.len() >= 4 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(audit.len(), 4, "{audit:#?}");
    let has = |i: usize, parts: &[&str]| {
        assert!(
            parts.iter().all(|p| audit[i].contains(p)),
            "line {i} lacks {parts:?}: {}",
            audit[i]
        )
    };
    has(
        0,
        &[
            "who=\"deployer\"",
            "method=POST",
            "path=\"/schedules\"",
            // The object the call made, the request id, latency and client address.
            "object=\"life=audited\"",
            "request_id=\"trace-abc-1\"",
            "latency_ms=",
            "client=\"127.0.0.1:",
            "status=200",
        ],
    );
    has(1, &["who=\"token-", "method=DELETE", "status=403"]);
    has(2, &["who=\"unknown-token\"", "method=GET", "status=401"]);
    has(
        3,
        &[
            "who=\"deployer\"",
            "method=DELETE",
            "path=\"/schedules/audited\"",
            "object=\"life=audited\"",
            &format!("request_id=\"{delete_id}\""),
            "status=200",
        ],
    );
    assert!(
        !host.log_text().contains("s3cret"),
        "a secret reached the log"
    );
}

/// One HTTP/1.1 request on a fresh connection; the whole response as text (head and
/// body), to read headers the JSON client does not return.
fn http_exchange(host: &Host, path: &str, authorization: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(host.addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: kairos\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// RFC 7235: the auth scheme is case-insensitive; RFC 6750: a 401 carries a Bearer
/// challenge. Each refusal says what was wrong with the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive_and_a_401_carries_its_challenge() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&["--api-tokens", "r3ad:read"]));
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let reply = http_exchange(&host, "/schedules", Some(&format!("{scheme} r3ad")));
        assert!(reply.starts_with("HTTP/1.1 200"), "{scheme}: {reply}");
    }
    let cases = [
        (None, "needs `Authorization: Bearer <token>`", false),
        (Some("Basic cjNhZDo="), "uses the `Basic` scheme", false),
        (Some("Bearer"), "no token", false),
        (Some("bearer wrong"), "unknown API token", true),
    ];
    for (header, says, invalid_token) in cases {
        let reply = http_exchange(&host, "/schedules", header);
        let lower = reply.to_ascii_lowercase();
        assert!(reply.starts_with("HTTP/1.1 401"), "{header:?}: {reply}");
        assert!(reply.contains(says), "{header:?}: {reply}");
        assert!(
            lower.contains("www-authenticate: bearer realm=\"kairos\""),
            "{header:?}: {reply}"
        );
        assert_eq!(
            lower.contains("error=\"invalid_token\""),
            invalid_token,
            "{header:?}: {reply}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_times_are_read_in_the_configured_zone() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&["--timezone", "Asia/Tokyo"]));
    let api = Api::new(&host);
    // 15:05 in Tokyo is 06:05 UTC.
    let (status, local) = api
        .post("/schedules", &point("tz1", "2030-12-15 15:05:00"))
        .await;
    assert_eq!(status, 200, "{local}");
    assert_eq!(local["birth_time"], "2030-12-15T15:05:00+09:00");
    assert_eq!(local["birth_time_ms"], 1_923_545_100_000i64);
    // The same instant as RFC 3339 with another offset.
    let (_, rfc) = api
        .post("/schedules", &point("tz2", "2030-12-15T07:05:00+01:00"))
        .await;
    assert_eq!(rfc["birth_time_ms"], local["birth_time_ms"]);
    let tz1 = redis.keyspace().await.life("tz1").clone();
    let score = redis.tree_score(&tz1.due(), "tz1:birth").await;
    assert_eq!(score, Some(1_923_545_100_000));
    // Redis keeps the instant only; the zone is the API's to render.
    let (stored, _) = redis.life_record(&tz1, "tz1").await.unwrap();
    assert_eq!(stored.birth_ms, 1_923_545_100_000);
    let (_, shown) = api.get("/schedules/tz1").await;
    assert_eq!(shown["birth_time"], "2030-12-15T15:05:00+09:00", "{shown}");
    // A flat body with a term in local time, and the list filter in local time.
    let (status, t) = api
        .post("/schedules", &json!({"life_uuid": "tz3", "schedule_type": "term", "birth_time": "2030-12-16 09:00:00", "death_time": "2030-12-16 10:00:00", "birth_action": hook(), "death_action": hook()}))
        .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        t["death_time_ms"].as_i64().unwrap() - t["birth_time_ms"].as_i64().unwrap(),
        3_600_000
    );
    let (_, page) = api.get("/schedules?from=2030-12-16%2000:00:00").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["life_uuid"], "tz3");
    // Spring-forward gaps have no local time: refused with a hint.
    let host_ny = Host::start(
        &redis.url(),
        &flags(&["--timezone", "America/New_York", "--key-prefix", "ny"]),
    );
    let r = Api::new(&host_ny)
        .post("/schedules", &point("gap", "2031-03-09 02:30:00"))
        .await;
    assert_eq!(code(&r), (400, "invalid_time"));
    assert!(r.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("daylight-saving"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_a_burst_leaves_each_booking_whole_or_absent() {
    let redis = RedisServer::start();
    let mut host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // 32 clients book as fast as they can until the host dies under them.
    let mut clients = Vec::new();
    for _ in 0..32 {
        let (api, next, acknowledged) = (api.clone(), next.clone(), acknowledged.clone());
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let body = term(
                    &format!("b{i}"),
                    &format!("res-{i}"),
                    "2030-01-01 00:00:00",
                    "2030-01-01 01:00:00",
                );
                // Api panics on a connection error; run each request in its own task so a
                // refused connection just ends this client.
                let api = api.clone();
                match tokio::spawn(async move { api.post("/schedules", &body).await.0 }).await {
                    Ok(200) => acknowledged.lock().unwrap().push(i),
                    Ok(other) => panic!("booking b{i} refused with {other}"),
                    Err(_) => return,
                }
            }
        }));
    }
    while next.load(std::sync::atomic::Ordering::Relaxed) < 1500 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    host.kill9();
    for c in clients {
        c.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 1000,
        "only {} bookings landed before the kill",
        acknowledged.len()
    );

    let mut conn = redis.conn().await;
    let ks = redis.keyspace().await;
    // (id, shard index, record) of every Life in Redis.
    let mut lives = Vec::new();
    let (mut due, mut index, mut resources) = (Vec::new(), Vec::new(), 0);
    for k in ks.shards() {
        let p = &k.prefix;
        for (id, record) in redis.life_records(k).await {
            lives.push((id, k.index, record));
        }
        let d = kairos::store::inspect::tree_members(&mut conn, &k.due())
            .await
            .unwrap();
        due.extend(d.into_iter().map(|(m, _)| m));
        let i = kairos::store::inspect::tree_members(&mut conn, &k.lives())
            .await
            .unwrap();
        index.extend(i);
        // A Life's Plans are in its record: no key of their own.
        let plans: Vec<String> = conn.keys(format!("{p}plan:*")).await.unwrap();
        assert_eq!(plans, Vec::<String>::new());
        let r: Vec<String> = conn.keys(format!("{p}resource:*")).await.unwrap();
        resources += r.len();
    }
    assert_eq!(lives.len(), due.len());
    assert_eq!(lives.len(), index.len());
    assert_eq!(lives.len(), resources);
    for i in &acknowledged {
        let id = format!("b{i}");
        let shard = ks.resource(&format!("res-{i}"));
        assert!(
            lives.iter().any(|(l, s, _)| *l == id && *s == shard.index),
            "acknowledged booking {id} lost"
        );
        // Found by id alone: its home shard holds it or points to it.
        let home = ks.life(&id);
        if home.index != shard.index {
            let pointer: Option<String> = conn.get(home.pointer(&id)).await.unwrap();
            assert_eq!(
                pointer.and_then(|p| p.split(':').next().map(str::to_string)),
                Some(shard.index.to_string()),
                "{id} has no pointer to its shard"
            );
        }
    }
    for (id, shard, life) in &lives {
        assert!(life.is_term(), "{id} is not the term it was booked as");
        let rid = life
            .resource_id
            .as_deref()
            .unwrap_or_else(|| panic!("{id} lost its resource"));
        assert!(due.contains(&format!("{id}:birth")), "{id} birth not due");
        let in_resource: Option<f64> = conn
            .zscore(ks.shard(*shard).resource(rid), id)
            .await
            .unwrap();
        assert!(
            in_resource.is_some(),
            "{id} missing from its resource index"
        );
        assert_eq!(life.birth.state, None, "{id}'s birth left Standby");
        assert_eq!(life.death.state, None, "{id}'s death left Standby");
        assert!(life.death_action.is_some(), "{id} lost its death action");
    }
    eprintln!(
        "{} bookings in Redis, {} acknowledged before the kill; each is whole",
        lives.len(),
        acknowledged.len()
    );
}

/// Found by the API fuzzer (`scripts/api_fuzz.py`): a body giving one field in both of
/// its spellings was booked with one of them, silently; which one the client meant is a
/// guess, so it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_in_both_spellings_is_refused() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    let both = [
        json!({"birth_time": "2030-01-01 00:00:00", "birth": hook(), "birth_action": hook()}),
        json!({"birth_time": "2030-01-01 00:00:00", "term": {"birth_time": "2030-01-01 00:00:00"},
               "birth": hook()}),
        json!({"schedule_type": "term", "birth_time": "2030-01-01 00:00:00", "birth": hook(),
               "term": {"death_time": "2030-01-02 00:00:00"}, "death_time": "2030-01-02 00:00:00",
               "death": hook()}),
        json!({"schedule_type": "term", "birth_time": "2030-01-01 00:00:00", "birth": hook(),
               "death_time": "2030-01-02 00:00:00", "death": hook(), "death_action": hook()}),
    ];
    for body in &both {
        let r = api.post("/schedules", body).await;
        assert_eq!(code(&r), (400, "invalid_body"), "{body}: {}", r.1);
        assert!(
            r.1["error"]["message"].as_str().unwrap().contains("both"),
            "{}",
            r.1
        );
    }
    let r = api
        .post("/schedules", &point("one", "2030-01-01 00:00:00"))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    let r = api
        .patch(
            "/schedules/one",
            &json!({"birth": hook(), "birth_action": hook()}),
        )
        .await;
    assert_eq!(code(&r), (400, "invalid_body"), "{}", r.1);
    // Nothing but the one good booking was stored.
    let (status, list) = api.get("/schedules").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
}

/// Found by the API fuzzer: query strings are read into typed parameters, so one that does
/// not parse, or that the route does not take, is a 400 `invalid_query` with the error body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters_that_do_not_parse_are_400() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    for path in [
        "/schedules?limit=abc",
        "/schedules?limit=-1",
        "/schedules?limit=0",
        "/schedules?state=Sleeping",
        "/schedules?resource_idd=x",
        "/schedules?limit=5&limit=6",
    ] {
        let r = api.get(path).await;
        assert_eq!(code(&r), (400, "invalid_query"), "{path}: {}", r.1);
    }
    assert_eq!(api.get("/schedules?limit=5&state=Alive").await.0, 200);
    let r = api
        .post("/schedules", &point("q1", "2030-01-01 00:00:00"))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    let r = api.delete("/schedules/q1?force=maybe").await;
    assert_eq!(code(&r), (400, "invalid_query"), "{}", r.1);
    let (status, life) = api.get("/schedules/q1").await;
    assert_eq!((status, life["state"].as_str()), (200, Some("Inexistent")));
    assert_eq!(api.delete("/schedules/q1?force=false").await.0, 200);
}

/// Single bookings that arrive together go to Redis together (store/book_batch.rs), yet
/// each is judged on its own: of two bookings of one id exactly one is stored, of forty
/// overlapping terms of one resource exactly one, and bookings that clash with nothing
/// are all stored, each answered with its own outcome and each readable after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookings_sent_together_are_each_judged_alone() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    let mut bodies = Vec::new();
    for i in 0..40 {
        let id = format!("twice-{i}");
        bodies.push((format!("dup:{id}"), point(&id, "2030-01-01 00:00:00")));
        bodies.push((format!("dup:{id}"), point(&id, "2030-01-02 00:00:00")));
        bodies.push((
            "clash".to_string(),
            term(
                &format!("clash-{i}"),
                "one-room",
                "2030-02-01 10:00:00",
                "2030-02-01 11:00:00",
            ),
        ));
        bodies.push((
            "free".to_string(),
            term(
                &format!("free-{i}"),
                &format!("room-{i}"),
                "2030-02-01 10:00:00",
                "2030-02-01 11:00:00",
            ),
        ));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (group, body) in bodies {
        let api = api.clone();
        tasks.spawn(async move {
            let reply = api.post("/schedules", &body).await;
            (
                group,
                body["life_uuid"].as_str().unwrap().to_string(),
                reply,
            )
        });
    }
    let mut booked = Vec::new();
    let mut outcomes: std::collections::BTreeMap<String, Vec<(u16, String)>> = Default::default();
    while let Some(done) = tasks.join_next().await {
        let (group, id, reply) = done.unwrap();
        let code = code(&reply).1.to_string();
        if reply.0 == 200 {
            assert_eq!(reply.1["life_uuid"], id.as_str(), "{}", reply.1);
            booked.push(id);
        }
        outcomes.entry(group).or_default().push((reply.0, code));
    }
    for (group, got) in &outcomes {
        let ok = got.iter().filter(|(s, _)| *s == 200).count();
        let refused: Vec<&(u16, String)> = got.iter().filter(|(s, _)| *s != 200).collect();
        match group.as_str() {
            "free" => assert_eq!((ok, refused.len()), (40, 0), "{got:?}"),
            "clash" => {
                assert_eq!(ok, 1, "{got:?}");
                assert!(
                    refused
                        .iter()
                        .all(|r| *r == &(409, "resource_conflict".into())),
                    "{got:?}"
                );
            }
            _ => {
                assert_eq!(ok, 1, "{group}: {got:?}");
                assert_eq!(refused, [&(409, "duplicate_life_uuid".into())], "{group}");
            }
        }
    }
    assert_eq!(booked.len(), 40 + 1 + 40);
    for id in &booked {
        let (status, life) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(
            (status, life["state"].as_str()),
            (200, Some("Inexistent")),
            "{id}"
        );
    }
    // The census counted each stored Life once, and nothing refused.
    let (status, page) = api.get("/schedules?limit=1").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["total"], booked.len(), "{page}");
}

/// A booking whose write fails inside Redis (its resource's index is a key of the wrong
/// type, written by hand) is answered 503 and stored nowhere, and the bookings that went
/// to Redis in the same call are stored and answered as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_that_fails_in_redis_spoils_none_sent_with_it() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    let ks = redis.keyspace().await;
    let index = ks.resource("spoilt").resource("spoilt");
    redis.cli(&["SET", &index, "not a sorted set"]);
    let mut bookings = Vec::new();
    for i in 0..20 {
        bookings.push(point(&format!("fine-{i}"), "2030-01-01 00:00:00"));
        if i == 10 {
            bookings.push(term(
                "spoilt-1",
                "spoilt",
                "2030-01-02 00:00:00",
                "2030-01-02 01:00:00",
            ));
        }
    }
    let (status, reply) = api
        .post("/schedules/batch", &json!({"bookings": bookings}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let items = reply["items"].as_array().unwrap();
    for (i, item) in items.iter().enumerate() {
        if i == 11 {
            assert_eq!(
                (item["status"].as_u64(), item["error"]["code"].as_str()),
                (Some(503), Some("storage_unavailable")),
                "{item}"
            );
        } else {
            assert_eq!(item["status"], 200, "{item}");
        }
    }
    for i in 0..20 {
        let (status, _) = api.get(&format!("/schedules/fine-{i}")).await;
        assert_eq!(status, 200, "fine-{i}");
    }
    assert_eq!(api.get("/schedules/spoilt-1").await.0, 404);
}

/// `POST /schedules/batch`: each booking is checked and stored as `POST /schedules`
/// would, whole or not at all, and answered on its own, in order; a refused one stores
/// nothing and stops no other. A malformed batch is one 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_books_each_item_on_its_own_in_order() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &flags(&[]));
    let api = Api::new(&host);
    let mut bookings = vec![
        point("b-0", "2030-01-01 00:00:00"),
        term(
            "b-1",
            "conn-1",
            "2030-01-02 00:00:00",
            "2030-01-02 01:00:00",
        ),
        json!({"life_uuid": "b-2", "birth_time": "2030-01-01 00:00:00", "birth": hook(), "resource_idd": "typo"}),
        point("b-3", "2001-01-01 00:00:00"),
        point("b-0", "2030-01-03 00:00:00"),
        term(
            "b-5",
            "conn-1",
            "2030-01-02 00:10:00",
            "2030-01-02 00:50:00",
        ),
        json!("not a booking"),
    ];
    let (status, reply) = api
        .post("/schedules/batch", &json!({"bookings": bookings}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let items = reply["items"].as_array().unwrap();
    let got: Vec<(u64, &str)> = items
        .iter()
        .map(|i| {
            (
                i["status"].as_u64().unwrap(),
                i["error"]["code"]
                    .as_str()
                    .or(i["booking"]["life_uuid"].as_str())
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (200, "b-0"),
            (200, "b-1"),
            (400, "unknown_field"),
            (406, "too_soon"),
            (409, "duplicate_life_uuid"),
            (409, "resource_conflict"),
            (400, "invalid_body"),
        ],
        "{reply}"
    );
    assert_eq!(
        (reply["booked"].as_u64(), reply["refused"].as_u64()),
        (Some(2), Some(5))
    );
    assert_eq!(items[1]["booking"]["schedule_type"], "term");
    assert!(items[2]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resource_idd"));
    assert_eq!(api.get("/schedules/b-1").await.0, 200);
    for refused in ["b-2", "b-3", "b-5"] {
        assert_eq!(
            api.get(&format!("/schedules/{refused}")).await.0,
            404,
            "{refused}"
        );
    }
    let (_, b0) = api.get("/schedules/b-0").await;
    assert_eq!(
        b0["birth_time"], "2030-01-01T00:00:00Z",
        "the duplicate changed nothing"
    );

    // The bare list is read too; the same Idempotency-Key and body get the first answer,
    // booking nothing more; another body under the key is 422.
    bookings = (0..3)
        .map(|i| point(&format!("k-{i}"), "2030-02-01 00:00:00"))
        .collect();
    let keyed = [("idempotency-key", "batch-key-1")];
    let body = serde_json::to_vec(&bookings).unwrap();
    let first = api
        .call(Method::POST, "/schedules/batch", body.clone(), &keyed)
        .await;
    assert_eq!(
        (first.0, first.2["booked"].as_u64()),
        (200, Some(3)),
        "{}",
        first.2
    );
    let again = api
        .call(Method::POST, "/schedules/batch", body, &keyed)
        .await;
    assert_eq!(again.0, 200);
    assert_eq!(again.1["idempotent-replayed"], "true");
    assert_eq!(again.2, first.2);
    let other = serde_json::to_vec(&bookings[..2]).unwrap();
    assert_eq!(
        code(
            &api.raw(Method::POST, "/schedules/batch", other, &keyed)
                .await
        ),
        (422, "idempotency_key_reused")
    );
    let (_, page) = api.get("/schedules?limit=1000").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 5, "{page}");

    // What is not a batch is refused whole.
    let many: Vec<Value> = (0..1001)
        .map(|i| point(&format!("m-{i}"), "2030-03-01 00:00:00"))
        .collect();
    for (body, expected) in [
        (json!([]), (400, "invalid_batch")),
        (json!({"bookings": []}), (400, "invalid_batch")),
        (json!(many), (400, "invalid_batch")),
        (
            json!({"bookings": [point("x", "2030-01-01 00:00:00")], "extra": 1}),
            (400, "unknown_field"),
        ),
        (json!({"items": []}), (400, "unknown_field")),
        (json!({}), (400, "invalid_batch")),
        (json!("bookings"), (400, "invalid_batch")),
    ] {
        let reply = api.post("/schedules/batch", &body).await;
        assert_eq!(code(&reply), expected, "{}", reply.1);
    }
    assert_eq!(
        code(
            &api.raw(Method::POST, "/schedules/batch", b"[{".to_vec(), &[])
                .await
        ),
        (400, "invalid_json")
    );
    let (_, page) = api.get("/schedules?limit=1000").await;
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        5,
        "nothing more was booked"
    );
}
