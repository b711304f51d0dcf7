//! `kairos book|ls|show|cancel`: the command-line client against a real host.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

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
    let (code, out, err) = kairos(&host, "ops", &["book", "--json", body, "-o", "json"], None);
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
    assert!(out.starts_with("booked cli-2 (point, "), "{out}");

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

    // A cut page names the cursor to go on from, and --cursor does.
    let (code, first, err) = kairos(&host, "peek", &["ls", "--limit", "1"], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first.lines().count(), 2, "{first}");
    let cursor = err
        .split("--cursor ")
        .nth(1)
        .expect("the cursor is printed")
        .trim()
        .trim_end_matches(')');
    let (code, next, err) = kairos(
        &host,
        "peek",
        &["ls", "--limit", "1", "--cursor", cursor],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(next.lines().nth(1).unwrap().starts_with("cli-2"), "{next}");

    // `show` is readable by default, JSON for scripts.
    let (code, out, _) = kairos(&host, "peek", &["show", "cli-1"], None);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("life      cli-1 (term, resource conn-9)\nstate     Inexistent\n"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("death") && l.contains("Standby") && l.contains("POST /off")),
        "{out}"
    );
    assert!(out.contains("no runs yet"), "{out}");
    let (code, out, _) = kairos(&host, "peek", &["show", "cli-1", "--output", "json"], None);
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
    let (code, out, err) = kairos(
        &host,
        "peek",
        &["timers", "show", "nightly", "-o", "json"],
        None,
    );
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
    let (code, out, _) = kairos(
        &host,
        "peek",
        &["queues", "show", "mail", "-o", "json"],
        None,
    );
    assert_eq!(code, 0);
    let queue: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(queue["max_concurrent"], 4);
    let (code, out, _) = kairos(&host, "peek", &["queues", "show", "mail"], None);
    assert_eq!(code, 0);
    assert!(out.starts_with("queue           mail\n"), "{out}");
    assert!(out.lines().any(|l| l == "max concurrent  4"), "{out}");
    assert!(
        out.lines()
            .any(|l| l == "tasks           0 pending, 0 running, 0 failed"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("rate            2/s, bucket ")),
        "{out}"
    );
    // A timer's summary reads as lines, its preview below.
    let (code, out, _) = kairos(&host, "peek", &["timers", "show", "nightly"], None);
    assert_eq!(code, 0);
    assert!(out.starts_with("timer     nightly\n"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("schedule  ") && l.ends_with("(Asia/Tokyo)")),
        "{out}"
    );
    assert!(!out.contains('{') && !out.contains("preview:"), "{out}");
    let (code, out, _) = kairos(&host, "peek", &["timers", "runs", "nightly"], None);
    assert_eq!(code, 0);
    assert_eq!(out, "timer nightly has no runs yet\n");

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
    assert!(out.lines().any(|l| l == "version: 1"), "{out}");
    let (code, out, err) = kairos(
        &host,
        "root",
        &["plugins", "show", "noop", "-o", "json"],
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

    let (code, out, _) = kairos(
        &host,
        "ops",
        &["plugins", "show", "noop", "--output", "json"],
        None,
    );
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["versions"].as_array().unwrap().len(), 1);

    let (code, _, err) = kairos(&host, "root", &["plugins", "rm", "noop"], None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = kairos(&host, "ops", &["plugins", "show", "noop"], None);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
}

/// `kairos timers check` reads a schedule without a server: its description, DST rule
/// and next fire times in the zone asked for; a bad schedule exits 1 naming the field.
#[test]
fn timers_check_reads_a_schedule_without_a_server() {
    let run = |args: &[&str]| {
        let out = Command::new(kairos_bin())
            .args(["--server", "http://127.0.0.1:9"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[
        "timers",
        "check",
        "0 9 * * 1-5",
        "--tz",
        "Europe/London",
        "--from",
        "2026-11-26 12:00:00",
        "-n",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("At 09:00, Monday through Friday"), "{out}");
    assert!(out.contains("Fri 2026-11-27 09:00:00 GMT"), "{out}");
    assert!(out.contains("Mon 2026-11-30 09:00:00 GMT"), "{out}");
    assert!(out.contains("a fixed time of day"), "{out}");

    let (code, out, err) = run(&[
        "timers",
        "check",
        "@hourly",
        "--tz",
        "Europe/London",
        "--from",
        "2026-10-24T23:30:00Z",
        "-n",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let checked: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(checked["dst_rule"], "elapsed");
    assert_eq!(
        checked["preview"],
        serde_json::json!([
            "2026-10-25T01:00:00+01:00",
            "2026-10-25T01:00:00Z",
            "2026-10-25T02:00:00Z"
        ]),
        "01:00 twice: the autumn hour repeats and @hourly follows elapsed time"
    );

    let (code, _, err) = run(&["timers", "check", "0 9 * * 8"]);
    assert_eq!(code, 1);
    assert!(err.contains("day of week: 8 is out of 0-7"), "{err}");
}

/// The CLI covers what operators change: timers created, edited and removed; queues
/// created, filled, purged and removed; each checked through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_edits_and_removes_timers_and_queues() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "root:admin")]),
    );
    let api = Api::new(&host).with_token("root");

    let (code, out, err) = kairos(
        &host,
        "root",
        &[
            "timers",
            "create",
            "report",
            "--schedule",
            "0 9 * * 1-5",
            "--tz",
            "Europe/Paris",
            "--url",
            "/report",
            "--priority",
            "2",
            "--inactive",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == "name: report"), "{out}");
    let (status, timer) = api.get("/timers/report").await;
    assert_eq!(status, 200);
    assert_eq!(timer["schedule"], "0 9 * * 1-5");
    assert_eq!(timer["timezone"], "Europe/Paris");
    assert_eq!(timer["priority"], 2);
    assert_eq!(timer["action"]["path"], "/report");
    assert_eq!(timer["state"], "Inactive", "{timer:#}");

    let (code, _, err) = kairos(
        &host,
        "root",
        &["timers", "edit", "report", "--schedule", "30 8 * * *"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (_, timer) = api.get("/timers/report").await;
    assert_eq!(timer["schedule"], "30 8 * * *");
    assert_eq!(
        timer["timezone"], "Europe/Paris",
        "only the fields given change"
    );
    let (code, _, err) = kairos(&host, "root", &["timers", "rm", "report"], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(api.get("/timers/report").await.0, 404);

    let (code, _, err) = kairos(
        &host,
        "root",
        &[
            "queues",
            "create",
            "mail",
            "--rate",
            "0.5",
            "--max-concurrent",
            "2",
            "--retry",
            r#"{"limit": 7}"#,
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (_, queue) = api.get("/queues/mail").await;
    assert_eq!(queue["rate"], 0.5, "{queue:#}");
    assert_eq!(queue["max_concurrent"], 2);
    assert_eq!(queue["retry"]["limit"], 7);
    // Tasks due an hour from now: they wait, to be purged.
    for (name, expire_after) in [("t1", None), ("t2", Some("2h"))] {
        let mut args = vec![
            "queues",
            "tasks",
            "add",
            "mail",
            "--url",
            "/send",
            "--name",
            name,
            "--countdown",
            "1h",
        ];
        args.extend(
            expire_after
                .map(|e| ["--expire-after", e])
                .into_iter()
                .flatten(),
        );
        let (code, _, err) = kairos(&host, "root", &args, None);
        assert_eq!(code, 0, "{err}");
    }
    let (_, t2) = api.get("/queues/mail/tasks/t2").await;
    let at = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(t2[field].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    assert_eq!(at("expires_at") - at("eta"), 7_200_000, "{t2:#}");
    let (_, t1) = api.get("/queues/mail/tasks/t1").await;
    assert!(t1["expires_at"].is_null(), "{t1:#}");
    let (code, _, err) = kairos(
        &host,
        "root",
        &["queues", "tasks", "add", "mail", "-"],
        Some(r#"{"name": "t3", "countdown": "1h", "action": {"path": "/send", "method": "POST"}}"#),
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = kairos(
        &host,
        "root",
        &["queues", "tasks", "mail", "-o", "json"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 3, "{listed:#}");
    // For people: one line a task, under a header.
    let (code, out, err) = kairos(&host, "root", &["queues", "tasks", "mail"], None);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].starts_with("TASK  STATE"), "{out}");
    for name in ["t1", "t2", "t3"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{name}  ")) && l.ends_with("POST /send")),
            "{out}"
        );
    }
    let (code, out, err) = kairos(
        &host,
        "root",
        &["queues", "tasks", "show", "mail", "t2"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let words: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        words[..3],
        [
            vec!["task", "t2"],
            vec!["queue", "mail"],
            vec!["state", "Standby"]
        ],
        "{out}"
    );
    assert!(words.iter().any(|w| w[0] == "expires"), "{out}");
    let (code, out, err) = kairos(&host, "root", &["queues", "failed", "mail"], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "no tasks in queue mail\n");
    let (code, _, err) = kairos(
        &host,
        "root",
        &["queues", "tasks", "rm", "mail", "t3"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = kairos(&host, "root", &["queues", "purge", "mail"], None);
    assert_eq!(code, 0, "{err}");
    let (_, queue) = api.get("/queues/mail").await;
    assert_eq!(queue["tasks"]["pending"], 0, "{queue:#}");
    let (code, _, err) = kairos(&host, "root", &["queues", "rm", "mail"], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(api.get("/queues/mail").await.0, 404);

    // A refusal exits 1 with the server's code; a usage error exits 2.
    let (code, _, err) = kairos(&host, "root", &["timers", "rm", "report"], None);
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");
    let (code, _, err) = kairos(&host, "root", &["timers", "create"], None);
    assert_eq!(code, 2, "{err}");
}

/// `kairos completions SHELL` prints a completion script naming the commands, and a
/// listing cut short by its reader ends quietly instead of panicking on the broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_a_closed_pipe() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(kairos_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("timers") && script.contains("queues") && script.contains("plugins"),
            "{shell}: {script}"
        );
    }

    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    // More than a pipe's buffer (64 KiB) of rows, so that writing meets the closed pipe.
    for i in 0..1_000 {
        let (status, body) = api
            .post(
                "/schedules",
                &serde_json::json!({"life_uuid": format!("pipe-{i:04}"), "birth_time": "2030-01-01 00:00:00",
                                    "birth": {"path": "/x", "method": "POST"}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // `kairos ls --all | head -1`: the reader goes away after one line.
    let mut child = Command::new(kairos_bin())
        .args([
            "--server",
            &format!("http://{}", host.addr),
            "ls",
            "--all",
            "--limit",
            "100",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    assert_eq!(&first, b"LIFE");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

/// `kairos plugins run FILE.wasm` runs a component once, here, with no server or Redis,
/// in the sandbox a firing uses: its output, logs, each outbound request with the
/// policy's answer; a panic, a refused host and a deadline fail it with exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_run_runs_a_component_file_once_without_a_server() {
    let sink = Sink::start().await;
    let dir = TempDir::new("plugins-run");
    let file = |name: &str| {
        let path = dir.0.join(format!("{name}.wasm"));
        std::fs::write(&path, plugin_wasm(name)).unwrap();
        path.display().to_string()
    };
    let (forward, hostile) = (file("http-forward"), file("hostile"));
    let run = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || {
            let out = Command::new(kairos_bin())
                // No server: nothing here may need one.
                .args([
                    "--server",
                    "http://127.0.0.1:9",
                    "-o",
                    "json",
                    "plugins",
                    "run",
                ])
                .args(&args)
                .env_remove("RUST_BACKTRACE")
                .output()
                .unwrap();
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "{e}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            (
                out.status.code(),
                json,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    };
    let target = format!("127.0.0.1:{}", sink.addr.port());
    let input =
        serde_json::json!({"url": format!("http://{target}/hook"), "body": {"n": 1}}).to_string();

    // Allowed: the call reaches the sink, and the log names it with its answer.
    let (code, out, err) = run(vec![
        forward.clone(),
        "--input".into(),
        input.clone(),
        "--allow".into(),
        target.clone(),
    ])
    .await;
    assert_eq!(code, Some(0), "{out} {err}");
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["output"], r#"{"status":200}"#, "{out}");
    let logs = out["logs"].to_string();
    assert!(
        logs.contains(&format!("allowed: POST http://{target}/hook answered 200")),
        "{logs}"
    );
    assert!(out["run_ms"].as_f64().unwrap() > 0.0);
    let got = sink.wait_count(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].path, "/hook");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[0].body).unwrap()["n"],
        1
    );

    // Not allowed: refused by the plugin's list, said so, and nothing sent.
    let (code, out, _) = run(vec![forward, "--input".into(), input]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out["logs"].to_string().contains("denied: outbound policy"),
        "{out}"
    );
    assert_eq!(sink.received().len(), 1, "a refused call was sent");

    // A panic, and a loop stopped by the deadline.
    let (code, out, err) = run(vec![
        hostile.clone(),
        "--input".into(),
        r#"{"mode":"panic"}"#.into(),
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(
        out["error"].as_str().unwrap().contains("panicked at"),
        "{out}"
    );
    assert!(err.contains("the run failed"), "{err}");
    let (code, out, _) = run(vec![
        hostile.clone(),
        "--input".into(),
        r#"{"mode":"loop"}"#.into(),
        "--timeout".into(),
        "300ms".into(),
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(
        out["error"].as_str().unwrap().contains("300 ms deadline"),
        "{out}"
    );
    assert!(out["run_ms"].as_f64().unwrap() < 5_000.0, "{out}");
    // A booking has no scheduler here: refused, and the log shows what it would book.
    let (_, out, _) = run(vec![
        hostile.clone(),
        "--input".into(),
        r#"{"mode":"book-big","size":10}"#.into(),
    ])
    .await;
    assert!(out.to_string().contains("no_scheduler"), "{out}");

    // An input the plugin's declared schema refuses: exit 1, as a booking would be
    // refused (400 invalid_input), and nothing runs.
    let out = Command::new(kairos_bin())
        .args(["plugins", "run", &file("http-forward"), "--input"])
        .arg(r#"{"url": 5}"#)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--input at /url does not fit the input schema")
            && err.contains("invalid_input"),
        "{err}"
    );

    // Not a component: exit 1 with the reason, no run.
    let not_wasm = dir.0.join("notes.txt");
    std::fs::write(&not_wasm, "hello").unwrap();
    let out = Command::new(kairos_bin())
        .args(["plugins", "run", &not_wasm.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a WebAssembly binary"));
}

/// `kairos plugins run` keeps what it compiles in the user's cache
/// (`$XDG_CACHE_HOME/kairos/plugin-cache`, mode 0700), so that the same file runs again
/// without compiling; compiled code is never loaded from a directory others may write.
#[test]
fn plugins_run_compiles_a_file_once_into_a_private_cache() {
    let dir = TempDir::new("plugins-run-cache");
    let wasm = dir.0.join("noop.wasm");
    std::fs::write(&wasm, plugin_wasm("noop")).unwrap();
    let cache_home = dir.0.join("cache");
    let run = || {
        let out = Command::new(kairos_bin())
            .args([
                "--server",
                "http://127.0.0.1:9",
                "-o",
                "json",
                "plugins",
                "run",
            ])
            .arg(&wasm)
            .env("XDG_CACHE_HOME", &cache_home)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["ok"], true, "{json}");
        json["compiled_from_cache"].as_bool().unwrap()
    };
    assert!(!run(), "the first run compiles");
    assert!(run(), "the second loads what the first compiled");
    let cache = cache_home.join("kairos/plugin-cache");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    // A cache directory others may write to is not trusted: it compiles again.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(
        !run(),
        "loaded compiled code from a world-writable directory"
    );
}

/// `kairos book -` with JSON lines (or a JSON list) books them through
/// `POST /schedules/batch`, 1,000 per call, printing each line's result in order; any
/// refused line makes the exit code 1, and the others are booked all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_books_json_lines_in_batches() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--api-tokens", "ops:book")]));
    let line = |i: usize| {
        format!(
            r#"{{"life_uuid": "jl-{i}", "birth_time": "2030-05-02 10:00:00", "birth": {{"path": "/x", "method": "POST", "body": {{"n": {i}}}}}}}"#
        )
    };
    // 1,203 lines: two batch calls; line 1,202 is a duplicate of line 1, so refused.
    let mut lines: Vec<String> = (0..1201).map(line).collect();
    lines.push(line(0));
    lines.push(String::new());
    lines.push(line(1201));
    let (code, out, err) = kairos(&host, "ops", &["book", "-"], Some(&lines.join("\n")));
    assert_eq!(code, 1, "a refused line fails the command: {out}\n{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert!(
        rows[0].starts_with("1: booked jl-0 (point, "),
        "{}",
        rows[0]
    );
    assert!(
        rows[1201].starts_with("1202: refused 409 duplicate_life_uuid"),
        "{}",
        rows[1201]
    );
    assert!(
        rows[1202].starts_with("1203: booked jl-1201 "),
        "{}",
        rows[1202]
    );
    assert_eq!(rows[1203], "1202 booked, 1 refused");
    assert!(err.contains("1 of 1203 bookings were refused"), "{err}");
    let api = Api::new(&host).with_token("ops");
    let (_, page) = api.get("/schedules?limit=1000").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1000);
    assert_eq!(api.get("/schedules/jl-1201").await.0, 200);

    // A JSON list, printed as JSON.
    let list = format!("[{}, {}]", line(5000), line(5001));
    let (code, out, err) = kairos(&host, "ops", &["book", "-", "-o", "json"], Some(&list));
    assert_eq!(code, 0, "{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["booked"], 2, "{answer}");
    assert_eq!(answer["items"][1]["booking"]["life_uuid"], "jl-5001");
    // A line that is not JSON is named, and nothing is sent.
    let (code, _, err) = kairos(
        &host,
        "ops",
        &["book", "-"],
        Some(&format!("{}\n{{oops\n", line(6000))),
    );
    assert_eq!(code, 1);
    assert!(err.contains("line 2: not a JSON booking"), "{err}");
    assert_eq!(api.get("/schedules/jl-6000").await.0, 404);
}

/// `serve --help` lists a host's flags, not the client's (`--server`, `--token`,
/// `--output`), and says how to choose what is logged; the client's flags still work
/// before or after a client command, and `serve` still takes them (ignored) as before.
#[test]
fn serve_help_leaves_out_client_flags_and_documents_rust_log() {
    let (code, out, err) = kairos_command(&["serve", "--help"]);
    assert_eq!(code, 0, "{err}");
    for flag in ["--server", "--token", "--output"] {
        assert!(!out.contains(flag), "{flag} in serve --help:\n{out}");
    }
    assert!(
        out.contains("--redis-url") && out.contains("--log-format"),
        "{out}"
    );
    assert!(out.contains("RUST_LOG"), "{out}");
    // The client's help keeps them.
    let (code, out, _) = kairos_command(&["ls", "--help"]);
    assert_eq!(code, 0);
    for flag in ["--server", "--token", "--output"] {
        assert!(out.contains(flag), "{flag} not in ls --help:\n{out}");
    }
    // Given before the command or after it, --server reaches the client (nothing listens
    // on port 9 of loopback: the error names it).
    for args in [
        &["--server", "http://127.0.0.1:9", "ls"][..],
        &["ls", "--server", "http://127.0.0.1:9", "-o", "json"][..],
    ] {
        let (code, _, err) = kairos_command(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("127.0.0.1:9"), "{args:?}: {err}");
    }
}
