//! `kairos book|ls|show|cancel`: the command-line client against a real host.

use std::io::Write;
use std::process::{Command, Stdio};

use kairos_e2e::*;
use serde_json::Value;

fn kairos(host: &Host, token: &str, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(kairos_bin())
        .args([
            "--server",
            &format!("http://{}", host.addr),
            "--token",
            token,
        ])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_books_lists_shows_and_cancels() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "ops:book,peek:read")]),
    );

    let body = r#"{"life_uuid": "cli-1", "schedule_type": "term", "resource_id": "conn-9",
                   "birth_time": "2030-05-01 10:00:00", "death_time": "2030-05-01 11:00:00",
                   "birth": {"path": "/on", "method": "POST"}, "death": {"path": "/off", "method": "POST"}}"#;
    let (code, out, err) = kairos(&host, "ops", &["book", "--json", body], None);
    assert_eq!(code, 0, "{err}");
    let booked: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(booked["life_uuid"], "cli-1");
    // From stdin.
    let (code, out, err) = kairos(
        &host,
        "ops",
        &["book", "-"],
        Some(
            r#"{"life_uuid": "cli-2", "birth_time": "2030-05-02 10:00:00", "birth": {"path": "/x", "method": "GET"}}"#,
        ),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cli-2"));

    let (code, out, err) = kairos(&host, "peek", &["ls"], None);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].starts_with("LIFE"), "{out}");
    assert!(
        rows[1].starts_with("cli-1") && rows[1].contains("term") && rows[1].contains("conn-9"),
        "{out}"
    );
    assert!(rows[2].starts_with("cli-2"), "{out}");
    let (_, out, _) = kairos(
        &host,
        "peek",
        &["ls", "--resource-id", "conn-9", "--json"],
        None,
    );
    let page: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, out, err) = kairos(&host, "peek", &["ls", "--limit", "1", "--all"], None);
    assert_eq!(
        out.lines().count(),
        3,
        "header and both Lives across two pages: {out}{err}"
    );

    let (code, out, _) = kairos(&host, "peek", &["show", "cli-1"], None);
    assert_eq!(code, 0);
    let life: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(life["plans"].as_array().unwrap().len(), 2);

    // Refusals exit 1 with the API's code and message.
    let (code, _, err) = kairos(&host, "peek", &["cancel", "cli-1"], None);
    assert_eq!(code, 1);
    assert!(err.contains("403 forbidden"), "{err}");
    let (code, _, err) = kairos(&host, "peek", &["ls", "--state", "Sleeping"], None);
    assert_eq!(code, 1);
    assert!(err.contains("400 invalid_query"), "{err}");
    let (code, _, err) = kairos(&host, "nope", &["show", "cli-1"], None);
    assert_eq!(code, 1);
    assert!(err.contains("401"), "{err}");

    let (code, out, err) = kairos(&host, "ops", &["cancel", "cli-1"], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Stillbirth"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_and_shows_timers_and_queues() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "root:admin,peek:read")]),
    );
    let api = Api::new(&host).with_token("root");
    let (status, reply) = api
        .post(
            "/timers",
            &serde_json::json!({"name": "nightly", "schedule": "02:00 14:00",
                                "timezone": "Asia/Tokyo", "action": hook("n"), "priority": 3}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api
        .put(
            "/queues/mail",
            &serde_json::json!({"rate": 2, "max_concurrent": 4}),
        )
        .await;
    assert_eq!(status, 200);

    let (code, out, err) = kairos(&host, "peek", &["timers"], None);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].starts_with("TIMER"), "{out}");
    assert!(
        rows[1].starts_with("nightly")
            && rows[1].contains("Asia/Tokyo")
            && rows[1].contains("02:00 14:00"),
        "{out}"
    );
    let (code, out, err) = kairos(&host, "peek", &["timers", "show", "nightly"], None);
    assert_eq!(code, 0, "{err}");
    let timer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(timer["preview"].as_array().unwrap().len(), 5);
    assert!(
        timer["preview"][0].as_str().unwrap().ends_with("+09:00"),
        "{timer:#}"
    );

    let (code, out, err) = kairos(&host, "peek", &["queues"], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().unwrap().starts_with("QUEUE"), "{out}");
    let mail = out
        .lines()
        .find(|l| l.starts_with("mail"))
        .expect("mail listed");
    assert!(mail.contains("running") && mail.contains(" 2 "), "{out}");
    assert!(out.lines().any(|l| l.starts_with("default")), "{out}");
    let (code, out, _) = kairos(&host, "peek", &["queues", "show", "mail"], None);
    assert_eq!(code, 0);
    let queue: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(queue["max_concurrent"], 4);

    // Changes need the admin scope.
    let (code, _, err) = kairos(&host, "peek", &["queues", "pause", "mail"], None);
    assert_eq!(code, 1);
    assert!(err.contains("403 forbidden"), "{err}");
    let (code, out, err) = kairos(&host, "root", &["queues", "pause", "mail"], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    let (code, _, err) = kairos(&host, "peek", &["timers", "runs", "nope"], None);
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_uploads_lists_shows_and_deletes_plugins() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "root:admin,ops:book")]),
    );
    let dir = TempDir::new("cli-plugin");
    let file = dir.0.join("noop.wasm");
    std::fs::write(&file, plugin_wasm("noop")).unwrap();
    let file = file.display().to_string();

    // Uploading needs the admin scope.
    let (code, _, err) = kairos(&host, "ops", &["plugins", "upload", "noop", &file], None);
    assert_eq!(code, 1);
    assert!(err.contains("403"), "{err}");
    let (code, out, err) = kairos(
        &host,
        "root",
        &[
            "plugins",
            "upload",
            "noop",
            &file,
            "--allowed-hosts",
            "api.example.com,127.0.0.1:9000",
            "--memory-mb",
            "16",
            "--timeout",
            "2s",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let meta: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["memory_mb"], 16);
    assert_eq!(meta["timeout_ms"], 2000);

    let (code, out, err) = kairos(&host, "ops", &["plugins", "ls"], None);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().nth(1).expect("one plugin row");
    assert!(row.starts_with("noop "), "{out}");
    assert!(row.contains("api.example.com,127.0.0.1:9000"), "{out}");

    let (code, out, _) = kairos(&host, "ops", &["plugins", "show", "noop"], None);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["versions"].as_array().unwrap().len(), 1);

    let (code, _, err) = kairos(&host, "root", &["plugins", "delete", "noop"], None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = kairos(&host, "ops", &["plugins", "show", "noop"], None);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
}
