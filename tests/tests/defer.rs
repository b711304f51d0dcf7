//! `/defer/{path}`: a request booked for later replays method, headers (minus hop-by-hop
//! and credentials) and body to the gateway at its time (SPEC section 2).

use std::time::Duration;

use axum::http::Method;
use kairos_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_requests_replay_method_headers_and_body() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--max-body-bytes", "2048")]));
    let api = Api::new(&host);

    let at = now_ms() + 1_500;
    let body = br#"{"order": 42, "note": "caf\u00e9"}"#.to_vec();
    let (status, reply) = api
        .raw(
            Method::POST,
            "/defer/api/v1/orders?dry_run=1&x=%20y",
            body.clone(),
            &[
                ("x-kairos-schedule-datetime", &rfc3339_ms(at)),
                ("x-custom", "kept"),
                ("authorization", "Bearer for-kairos-only"),
                ("connection", "keep-alive"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let posted = reply["life_uuid"].as_str().unwrap().to_string();
    assert_eq!(reply["birth_time_ms"], at);

    // The alternate header name, another method, no body.
    let (status, reply) = api
        .raw(
            Method::DELETE,
            "/defer/api/v1/orders/7",
            Vec::new(),
            &[("x-xaas-schedule-datetime", &rfc3339_ms(at + 200))],
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let deleted = reply["life_uuid"].as_str().unwrap().to_string();

    let got = sink.wait_count(2, Duration::from_secs(10)).await;
    let post = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&posted))
        .expect("the POST replayed");
    assert_eq!(post.method, "POST");
    assert_eq!(post.path, "/api/v1/orders");
    assert_eq!(post.query.as_deref(), Some("dry_run=1&x=%20y"));
    assert_eq!(
        post.body.as_ref(),
        body.as_slice(),
        "the body is replayed byte for byte"
    );
    assert_eq!(post.header("content-type"), Some("application/json"));
    assert_eq!(post.header("x-custom"), Some("kept"));
    assert_eq!(
        post.header("authorization"),
        None,
        "credentials for kairos are not forwarded"
    );
    assert_eq!(post.header("x-kairos-schedule-datetime"), None);
    assert_eq!(
        post.header("idempotency-key"),
        Some(format!("{posted}:birth").as_str())
    );
    assert!(post.at_ms >= at, "replayed {} ms early", at - post.at_ms);
    let del = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&deleted))
        .expect("the DELETE replayed");
    assert_eq!(
        (del.method.as_str(), del.path.as_str(), del.body.len()),
        ("DELETE", "/api/v1/orders/7", 0)
    );

    let life = api
        .wait_life(&posted, Duration::from_secs(5), |l| l["state"] == "Dead")
        .await;
    assert_eq!(life["schedule_type"], "point");
    assert_eq!(sink.received_for(&posted).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_requests_are_validated_like_bookings() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--max-body-bytes", "2048")]));
    let api = Api::new(&host);
    let code = |r: &(u16, serde_json::Value)| {
        (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_string())
    };

    let r = api.raw(Method::POST, "/defer/x", b"{}".to_vec(), &[]).await;
    assert_eq!(code(&r), (400, "missing_field".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            b"{}".to_vec(),
            &[("x-kairos-schedule-datetime", "soonish")],
        )
        .await;
    assert_eq!(code(&r), (400, "invalid_time".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            b"{}".to_vec(),
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 100))],
        )
        .await;
    assert_eq!(code(&r), (406, "too_soon".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            vec![b'a'; 4096],
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (413, "body_too_large".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            vec![0xff, 0xfe],
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (400, "invalid_body".into()));
    // Nothing was booked by the refusals.
    let (_, page) = api.get("/schedules").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0);

    // Without a gateway there is nowhere to replay to.
    let bare = Host::start(
        &redis.url(),
        &flags_with(fast_flags(), &[("--key-prefix", "nogw")]),
    );
    let r = Api::new(&bare)
        .raw(
            Method::POST,
            "/defer/x",
            Vec::new(),
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (400, "no_gateway".into()));
}

/// `POST /defer` with the request as JSON (for generated clients, which cannot send a
/// path as part of theirs): replayed like `/defer/{path}`, a JSON body as JSON and a
/// string as it is; refused with the spec's error body otherwise, booking nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_form_replays_the_request_it_describes() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let at = now_ms() + 1_500;

    let (status, reply) = api
        .post(
            "/defer",
            &serde_json::json!({"path": "orders/42/confirm?by=ops", "method": "put",
                "headers": {"x-custom": "kept"}, "body": {"n": 1, "list": [true, null]},
                "at": rfc3339_ms(at)}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["birth_time_ms"], at);
    let json_life = reply["life_uuid"].as_str().unwrap().to_string();
    let (status, reply) = api
        .post(
            "/defer",
            &serde_json::json!({"path": "/notes", "body": "plain text", "at": rfc3339_ms(at + 100)}),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let text_life = reply["life_uuid"].as_str().unwrap().to_string();

    let got = sink.wait_count(2, Duration::from_secs(10)).await;
    let put = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&json_life))
        .expect("the PUT replayed");
    assert_eq!(
        (put.method.as_str(), put.path.as_str(), put.query.as_deref()),
        ("PUT", "/orders/42/confirm", Some("by=ops"))
    );
    assert_eq!(put.header("x-custom"), Some("kept"));
    let sent: serde_json::Value = serde_json::from_slice(&put.body).unwrap();
    assert_eq!(sent, serde_json::json!({"n": 1, "list": [true, null]}));
    let post = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&text_life))
        .expect("the POST replayed");
    assert_eq!(
        (post.method.as_str(), post.path.as_str()),
        ("POST", "/notes")
    );
    assert_eq!(post.body.as_ref(), b"plain text");

    let code = |r: &(u16, serde_json::Value)| {
        (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_string())
    };
    let later = rfc3339_ms(now_ms() + 60_000);
    for (body, expected) in [
        (
            serde_json::json!({"path": "/x", "at": later, "when": 1}),
            (400, "unknown_field"),
        ),
        (serde_json::json!({"path": "/x"}), (400, "invalid_body")),
        (serde_json::json!({"at": later}), (400, "invalid_body")),
        (
            serde_json::json!({"path": "/x", "method": "BREW", "at": later}),
            (400, "invalid_action"),
        ),
        (
            serde_json::json!({"path": "/a b", "at": later}),
            (400, "invalid_action"),
        ),
        (
            serde_json::json!({"path": "/x", "at": "soonish"}),
            (400, "invalid_time"),
        ),
        (
            serde_json::json!({"path": "/x", "at": rfc3339_ms(now_ms() + 100)}),
            (406, "too_soon"),
        ),
        (serde_json::json!(["/x"]), (400, "invalid_body")),
    ] {
        let r = api.post("/defer", &body).await;
        assert_eq!(
            code(&r),
            (expected.0, expected.1.to_string()),
            "{body}: {}",
            r.1
        );
    }
    let r = api.raw(Method::POST, "/defer", b"{".to_vec(), &[]).await;
    assert_eq!(code(&r), (400, "invalid_json".into()));
    let r = api.raw(Method::GET, "/defer", Vec::new(), &[]).await;
    assert_eq!(code(&r), (405, "method_not_allowed".into()));
    // Only the two accepted bookings exist.
    let (_, page) = api.get("/schedules").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2, "{page}");
}

/// A deferred path whose slashes came encoded (`orders%2F42`, as a generated client
/// sends a path parameter) is refused with a 400 that says what to do, never stored as
/// another path; so is a method no action can use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_path_is_refused_not_stored() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let later = rfc3339_ms(now_ms() + 60_000);
    let when = [("x-kairos-schedule-datetime", later.as_str())];
    for path in ["/defer/orders%2F42%2Fconfirm", "/defer/orders%2f42?x=1"] {
        let (status, reply) = api.raw(Method::POST, path, Vec::new(), &when).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"]["code"], "encoded_path", "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("POST /defer"),
            "{reply}"
        );
    }
    // An encoded character other than `/` is a path as the target will read it.
    let (status, reply) = api
        .raw(Method::POST, "/defer/a%20b?q=%2F", Vec::new(), &when)
        .await;
    assert_eq!(status, 202, "{reply}");
    let (_, page) = api.get("/schedules").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    let (_, life) = api
        .get(&format!(
            "/schedules/{}",
            items[0]["life_uuid"].as_str().unwrap()
        ))
        .await;
    assert_eq!(life["plans"][0]["action"]["path"], "/a%20b?q=%2F", "{life}");
}
