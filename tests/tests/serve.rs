//! `kairos serve` as an operator meets it: a redis-server of its own when no redis_url is
//! given (kept across restarts, stopped on shutdown), and configuration from env vars and
//! a TOML file.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kairos_e2e::{free_port, kairos_bin, Api, RedisServer, TempDir};
use serde_json::json;

struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(kairos_bin());
        cmd.arg("serve")
            .args(["--listen", &addr])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "kairos did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        Serve { child, addr }
    }

    fn api(&self) -> Api {
        Api::at(&format!("http://{}", self.addr))
    }

    /// SIGTERM and wait; returns what it wrote to stderr.
    fn stop(mut self) -> String {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of the processes whose command line names `socket` (the managed redis-server).
fn redis_pids(socket: &std::path::Path) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-f", socket.to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn redis_on_socket_answers(socket: &std::path::Path) -> bool {
    Command::new("redis-cli")
        .arg("-s")
        .arg(socket)
        .arg("PING")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_its_own_redis_keeps_bookings_across_restarts_and_stops_it() {
    let data = TempDir::new("managed");
    let data_dir = data.0.join("data");
    let socket = data_dir.join("redis.sock");
    let args = [
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--gateway-url",
        "http://127.0.0.1:9",
    ];

    let first = Serve::start(&args, &[]);
    assert!(
        redis_on_socket_answers(&socket),
        "kairos should run redis-server on {}",
        socket.display()
    );
    let (status, booked) = first
        .api()
        .post("/schedules", &json!({"life_uuid": "kept", "birth_time": "2030-01-01 00:00:00", "birth": {"path": "/x", "method": "POST"}}))
        .await;
    assert_eq!(status, 200, "{booked}");
    let log = first.stop();
    assert!(
        log.contains(data_dir.to_str().unwrap()),
        "the data directory is printed: {log}"
    );
    assert!(
        !redis_on_socket_answers(&socket),
        "redis-server must stop with kairos"
    );
    let aof_written = std::fs::read_dir(&data_dir).unwrap().flatten().any(|e| {
        e.file_name().to_string_lossy().starts_with("appendonly")
            || e.file_name() == "appendonlydir"
    });
    assert!(
        aof_written,
        "the append-only file lives in the data directory"
    );

    // A new kairos on the same data directory finds the booking again.
    let second = Serve::start(&args, &[]);
    let (status, life) = second.api().get("/schedules/kept").await;
    assert_eq!(status, 200, "{life}");
    assert_eq!(life["state"], "Inexistent");
    // Its Redis never evicts, has a memory limit (half of the machine's by default),
    // and syncs its append-only file every second.
    assert_eq!(redis_config(&socket, "maxmemory-policy"), "noeviction");
    assert!(redis_config(&socket, "maxmemory").parse::<u64>().unwrap() > 0);
    assert_eq!(redis_config(&socket, "appendfsync"), "everysec");
    second.stop();
    assert!(!redis_on_socket_answers(&socket));

    // Asked for, a smaller limit and an fsync before every answer.
    let mut strict = args.to_vec();
    strict.extend(["--redis-maxmemory", "64mb", "--durability", "always"]);
    let third = Serve::start(&strict, &[]);
    assert_eq!(
        redis_config(&socket, "maxmemory"),
        (64u64 << 20).to_string()
    );
    assert_eq!(redis_config(&socket, "appendfsync"), "always");
    let (_, metrics) = third.api().text("/metrics").await;
    assert!(
        metrics.contains(r#"kairos_redis_info{maxmemory_policy="noeviction",appendonly="yes",appendfsync="always"} 1"#),
        "{metrics}"
    );
    third.stop();
}

/// A setting of the redis-server on `socket`, as CONFIG GET answers it.
fn redis_config(socket: &std::path::Path, name: &str) -> String {
    let out = Command::new("redis-cli")
        .arg("-s")
        .arg(socket)
        .args(["CONFIG", "GET", name])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().nth(1).unwrap_or_default().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_vars_and_the_config_file_configure_the_host() {
    let redis = RedisServer::start();
    let dir = TempDir::new("conf");
    let file = dir.0.join("kairos.toml");
    std::fs::write(&file, "timezone = \"Asia/Tokyo\"\nexecution_guard_time = \"2h\"\ngateway_url = \"http://127.0.0.1:9\"\n").unwrap();
    // The env var wins over the file for the guard; the file gives the zone.
    let host = Serve::start(
        &["--config", file.to_str().unwrap()],
        &[
            ("KAIROS_REDIS_URL", &redis.url()),
            ("KAIROS_EXECUTION_GUARD_TIME", "90m"),
        ],
    );
    let api = host.api();
    let in_100_min = kairos_e2e::at_ms_from_now(100 * 60_000);
    let (status, _) = api
        .post(
            "/schedules",
            &json!({"birth_time": in_100_min, "birth": {"path": "/x", "method": "GET"}}),
        )
        .await;
    assert_eq!(
        status, 200,
        "90 minutes of guard (env) allow a booking 100 minutes ahead; the file's 2 h would not"
    );
    let in_80_min = kairos_e2e::at_ms_from_now(80 * 60_000);
    let (status, _) = api
        .post(
            "/schedules",
            &json!({"birth_time": in_80_min, "birth": {"path": "/x", "method": "GET"}}),
        )
        .await;
    assert_eq!(status, 406);
    let (_, life) = api
        .post(
            "/schedules",
            &json!({"birth_time": "2030-06-01 09:00:00", "birth": {"path": "/x", "method": "GET"}}),
        )
        .await;
    assert_eq!(life["birth_time"], "2030-06-01T09:00:00+09:00");

    // A bad value stops the host at start with a message naming the parameter.
    let out = Command::new(kairos_bin())
        .args([
            "serve",
            "--redis-url",
            &redis.url(),
            "--minimum-life-term",
            "soon",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("minimum_life_term"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_own_redis_is_restarted_after_a_crash_and_loses_nothing() {
    let data = TempDir::new("managed-crash");
    let data_dir = data.0.join("data");
    let socket = data_dir.join("redis.sock");
    let serve = Serve::start(
        &[
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--gateway-url",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    let api = serve.api();
    for i in 0..20 {
        let (status, _) = api
            .post("/schedules", &json!({"life_uuid": format!("c{i}"), "birth_time": "2030-01-01 00:00:00", "birth": {"path": "/x", "method": "POST"}}))
            .await;
        assert_eq!(status, 200);
    }
    // SIGKILL the redis-server that kairos runs.
    let pid = redis_pids(&socket)
        .into_iter()
        .next()
        .expect("managed redis-server runs");
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    // kairos notices, restarts it on the same files, and goes on serving.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = api.get("/schedules/c19").await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kairos did not recover from its redis-server crashing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_pid = redis_pids(&socket).into_iter().next().unwrap_or_default();
    assert!(
        !new_pid.is_empty() && new_pid != pid,
        "a new redis-server serves the data directory"
    );
    for i in 0..20 {
        assert_eq!(
            api.get(&format!("/schedules/c{i}")).await.0,
            200,
            "booking c{i} lost in the crash"
        );
    }
    let (status, _) = api
        .post("/schedules", &json!({"birth_time": "2030-01-01 00:00:00", "birth": {"path": "/x", "method": "POST"}}))
        .await;
    assert_eq!(status, 200, "booking works again");
    serve.stop();
    assert!(!redis_on_socket_answers(&socket));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_left_running_by_a_killed_host_is_adopted_then_stopped() {
    let data = TempDir::new("managed-adopt");
    let data_dir = data.0.join("data");
    let socket = data_dir.join("redis.sock");
    let args = [
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--gateway-url",
        "http://127.0.0.1:9",
    ];
    let mut first = Serve::start(&args, &[]);
    let (status, _) = first
        .api()
        .post("/schedules", &json!({"life_uuid": "adopted", "birth_time": "2030-01-01 00:00:00", "birth": {"path": "/x", "method": "POST"}}))
        .await;
    assert_eq!(status, 200);
    // kill -9 of kairos: its redis-server child survives it.
    let _ = first.child.kill();
    let _ = first.child.wait();
    assert!(
        redis_on_socket_answers(&socket),
        "the orphaned redis-server keeps serving"
    );
    let orphan_pids = redis_pids(&socket);

    let second = Serve::start(&args, &[]);
    let (status, life) = second.api().get("/schedules/adopted").await;
    assert_eq!(status, 200, "{life}");
    assert_eq!(
        redis_pids(&socket),
        orphan_pids,
        "the orphan is adopted, not joined by a second server on the same files"
    );
    // The adopted server is supervised like one of its own: when it dies, a new one
    // starts on its data.
    for pid in &orphan_pids {
        Command::new("kill").args(["-9", pid]).status().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pids = redis_pids(&socket);
        if !pids.is_empty() && pids != orphan_pids && redis_on_socket_answers(&socket) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no redis-server took the adopted one's place"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = second.api().get("/schedules/adopted").await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the booking is not back after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = second.stop();
    assert!(log.contains("adopting it"), "{log}");
    assert!(
        log.contains("the adopted redis-server stopped answering"),
        "{log}"
    );
    assert!(
        !redis_on_socket_answers(&socket),
        "the adopted redis-server stops with kairos"
    );
}
