//! Harness for kairos end-to-end tests: a real `redis-server` per test on a free port,
//! real `kairos` host processes, a real HTTP sink that records what it receives, and a
//! small JSON client. Nothing is mocked.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub mod chaos;
pub mod keys;

pub use keys::Keyspace;

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// The `RUST_LOG` hosts started from here run under: debug for tests, whose failures
/// read the host's log; `quiet_hosts` sets `info` for benchmarks, where writing a debug
/// line a fire would be counted in the host's CPU.
static HOST_LOG: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Hosts started after this run at `RUST_LOG=info` (benchmarks).
pub fn quiet_hosts() {
    let _ = HOST_LOG.set("info");
}

/// A port nobody listens on right now.
/// A free port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free pair of ports (port, port + 10000) in 100 tries");
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("kairos-e2e-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // KAIROS_E2E_KEEP=1 keeps every test's files (host logs, Redis data) to look at.
        if std::env::var_os("KAIROS_E2E_KEEP").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn redis_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "PING"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
        .unwrap_or(false)
}

/// The API address in a host's log line `kairos is serving listen=127.0.0.1:PORT`.
fn serving_addr(log: &str) -> Option<SocketAddr> {
    log.lines()
        .find(|l| l.contains("kairos is serving"))?
        .split_whitespace()
        .find_map(|word| word.strip_prefix("listen="))?
        .parse()
        .ok()
}

/// The process id of the redis-server answering on `port` (`INFO server`).
fn redis_pid(port: u16) -> Option<u32> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "server"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A redis-server of this test's own, with an append-only file, on a free port.
pub struct RedisServer {
    pub port: u16,
    pub dir: TempDir,
    child: Option<Child>,
    fsync: &'static str,
    /// Set once it has run: from then on it keeps its port (its clients know it).
    started_once: bool,
}

/// The directory of the fixtures kept in the repository (`tests/fixtures`).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

impl RedisServer {
    /// A server that fsyncs its append-only file on every write, so that whatever it
    /// acknowledged survives a hard restart.
    pub fn start() -> RedisServer {
        Self::start_with_fsync("always")
    }

    /// A server holding the data of an RDB file (a keyspace written by an earlier
    /// kairos, kept under `tests/fixtures`), then appending as `start()` does.
    pub fn start_from_rdb(rdb: &Path) -> RedisServer {
        let dir = TempDir::new("redis");
        std::fs::copy(rdb, dir.0.join("dump.rdb")).expect("the RDB fixture is readable");
        let mut server = RedisServer {
            port: free_port(),
            dir,
            child: None,
            fsync: "always",
            started_once: false,
        };
        // Redis loads dump.rdb only when it starts without an append-only file; the file
        // is turned on once the data is in.
        server.spawn_with(&["--appendonly", "no"]);
        server.cli(&["CONFIG", "SET", "appendonly", "yes"]);
        server
    }

    /// A server with `appendfsync` set to `fsync` (`everysec` is what `kairos serve` runs
    /// its own Redis with).
    pub fn start_with_fsync(fsync: &'static str) -> RedisServer {
        let dir = TempDir::new("redis");
        let mut server = RedisServer {
            port: free_port(),
            dir,
            child: None,
            fsync,
            started_once: false,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        self.spawn_with(&["--appendonly", "yes"]);
    }

    /// Starts redis-server on this server's port, or, when another process took that port
    /// between `free_port` and the bind (a test running beside this one), on a fresh one.
    /// A restart (`start_again`) must keep its port and files, so it does not move.
    fn spawn_with(&mut self, extra: &[&str]) {
        for attempt in 0..5 {
            if attempt > 0 {
                assert!(
                    !self.started_once,
                    "redis-server could not start again on port {}: another process holds it",
                    self.port
                );
                self.port = free_port();
            }
            if self.try_spawn(extra) {
                self.started_once = true;
                return;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Spawns redis-server and waits until it answers; false when the port turned out to
    /// belong to another process (the child exited, or the server answering is not it).
    fn try_spawn(&mut self, extra: &[&str]) -> bool {
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendfsync",
                self.fsync,
            ])
            .args(extra)
            .arg("--dir")
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if redis_ping(self.port) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if redis_pid(self.port) != Some(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        self.child = Some(child);
        true
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server hard (SIGKILL) and starts it again on the same port and files.
    pub fn restart_hard(&mut self, down_for: Duration) {
        self.kill_hard();
        std::thread::sleep(down_for);
        self.start_again();
    }

    /// SIGKILL, and waits for the process to be gone; `start_again` brings it back.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and files (its append-only file is
    /// replayed) and waits until it answers PING; a no-op while it runs.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// Whether this server's process runs (it may be killed by `kill_hard`).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Runs redis-cli against this server and returns its stdout (formatted as on a
    /// terminal, so that docs can show exactly what a person sees).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--no-raw"])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many times Redis ran `command` (lowercase) since its stats were last reset
    /// (`CONFIG RESETSTAT`), inside scripts too, from `INFO commandstats`; 0 if never.
    pub fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A local Redis Cluster of this test's own: `masters` masters with `replicas` replicas
/// each, every node a redis-server on a free port (`--cluster-enabled yes`, append-only
/// file fsynced always), joined by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    children: HashMap<u16, Child>,
    pub dir: TempDir,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let dir = TempDir::new("cluster");
        let n = masters * (1 + replicas);
        let mut cluster = RedisCluster {
            ports: Vec::new(),
            children: HashMap::new(),
            dir,
        };
        // A node needs its port and its cluster bus port (port + 10000) free; a port
        // found free can still be taken before the node binds it, so a node that does
        // not come up is tried again on other ports.
        for _ in 0..n {
            let port = (0..5)
                .find_map(|_| {
                    let port = free_cluster_port();
                    cluster.try_spawn(port).then_some(port)
                })
                .expect("a cluster node starts on one of 5 pairs of free ports");
            cluster.ports.push(port);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Starts a node on `port`; false (and nothing left running) if it did not answer
    /// within 10 s.
    fn try_spawn(&mut self, port: u16) -> bool {
        let dir = self.dir.0.join(port.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "1500"])
            // As docs/operations.md asks of a cluster kairos runs on: the masters that did
            // not fail go on serving their slots while a failed one's replica takes over.
            .args(["--cluster-require-full-coverage", "no"])
            // A replica's first sync starts at once, not after the default 5 s wait.
            .args(["--repl-diskless-sync-delay", "0"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)");
        self.children.insert(port, child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !redis_ping(port) {
            let exited = self
                .children
                .get_mut(&port)
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                eprintln!("cluster node {port} did not start; trying other ports");
                self.kill(port);
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The node answering must be this one, not another test's server on the port.
        let own = self.children.get(&port).map(Child::id);
        if redis_pid(port) != own {
            eprintln!("port {port} answers for another process; trying other ports");
            self.kill(port);
            return false;
        }
        true
    }

    /// `redis+cluster://` with every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// redis-cli against one node (`-c`: follows redirections).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until every running node says `cluster_state:ok` and every replica is in
    /// sync with its master (so that WAIT can count it).
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.children.keys().all(|p| {
                let info = self.cli(*p, &["INFO", "replication"]);
                let synced = if info.contains("role:master") {
                    info.lines()
                        .filter(|l| l.starts_with("slave"))
                        .all(|l| l.contains("state=online"))
                } else {
                    info.contains("master_link_status:up")
                };
                synced
                    && self
                        .cli(*p, &["CLUSTER", "INFO"])
                        .contains("cluster_state:ok")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until a replica has taken over from the master at `victim` (killed): the
    /// cluster is ok again with as many masters as before, `victim` not among them.
    pub fn wait_failover(&self, victim: u16, masters: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.masters();
            let ok = now.len() == masters
                && !now.contains(&victim)
                && self.children.keys().all(|p| {
                    self.cli(*p, &["CLUSTER", "INFO"])
                        .contains("cluster_state:ok")
                });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over from {victim}: masters {now:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port of the master serving `slot`, as a running node sees it.
    pub fn master_of(&self, slot: u16) -> u16 {
        let any = *self.children.keys().next().expect("a node runs");
        let nodes = self.cli(any, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port: u16 = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            for range in &fields[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap_or(1), hi.parse().unwrap_or(0)),
                    None => (range.parse().unwrap_or(1), range.parse().unwrap_or(0)),
                };
                if (lo..=hi).contains(&slot) {
                    return port;
                }
            }
        }
        panic!("no master serves slot {slot}:\n{nodes}");
    }

    /// Masters now (ports), as a running node sees them.
    pub fn masters(&self) -> Vec<u16> {
        let any = *self.children.keys().next().expect("a node runs");
        self.cli(any, &["CLUSTER", "NODES"])
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| {
                l.split_whitespace()
                    .nth(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// Starts a node killed earlier again, with its own data and `nodes.conf`: a master
    /// that was failed over rejoins as a replica of the node that took its place.
    pub fn restart(&mut self, port: u16) {
        assert!(
            !self.children.contains_key(&port),
            "node {port} is still running"
        );
        assert!(self.try_spawn(port), "node {port} did not start again");
    }

    /// Whether the master at `port` has a replica in sync with it (online, so that
    /// `WAIT` counts it).
    pub fn has_replica_in_sync(&self, port: u16) -> bool {
        let info = self.cli(port, &["INFO", "replication"]);
        info.contains("role:master")
            && info
                .lines()
                .any(|l| l.starts_with("slave") && l.contains("state=online"))
    }

    /// SIGKILL of one node.
    pub fn kill(&mut self, port: u16) {
        if let Some(mut child) = self.children.remove(&port) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (_, mut child) in self.children.drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Path of the kairos binary built for these tests (`KAIROS_BIN` overrides).
pub fn kairos_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("KAIROS_BIN") {
        return PathBuf::from(bin);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("debug/kairos");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kairos` (scripts/test does)",
        bin.display()
    );
    bin
}

/// The data directory every test host shares: it holds only the compiled-plugin cache
/// (tests always give a Redis URL), which is keyed by digest and safe to share.
pub fn shared_data_dir() -> PathBuf {
    let dir = workspace_dir().join("target/e2e-data");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bytes of a plugin component built from `plugins/` (`scripts/test` builds them
/// into `target-plugins/`; `KAIROS_PLUGINS_DIR` overrides the directory).
pub fn plugin_wasm(crate_name: &str) -> Vec<u8> {
    let dir = std::env::var("KAIROS_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_dir().join("target-plugins/wasm32-wasip2/release"));
    let file = dir.join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the plugins with `cargo build --release --target wasm32-wasip2 --target-dir ../target-plugins` in plugins/ (scripts/test does)",
            file.display()
        )
    })
}

/// The bytes of a Python plugin, `plugins/python-{name}` built with componentize-py
/// (`build_python_plugins` in scripts/lib.sh, which keeps a component newer than its
/// sources). Built here when stale; nothing is installed: a missing componentize-py
/// fails the test with the command that installs it (scripts/test runs it).
pub fn python_plugin_wasm(name: &str) -> Vec<u8> {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    language_plugin_wasm(&BUILT, "python", name)
}

/// The bytes of a JavaScript plugin, `plugins/js-{name}` built with componentize-js
/// (`build_js_plugins`), as [`python_plugin_wasm`] does.
pub fn js_plugin_wasm(name: &str) -> Vec<u8> {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    language_plugin_wasm(&BUILT, "js", name)
}

/// `plugins/{lang}-{name}` built by `build_{lang}_plugins` (once per test binary) into
/// `target-plugins/{lang}/{lang}_{name}.wasm`.
fn language_plugin_wasm(
    built: &std::sync::OnceLock<Result<(), String>>,
    lang: &str,
    name: &str,
) -> Vec<u8> {
    let built = built.get_or_init(|| {
        let out = Command::new("bash")
            .args(["-c", &format!(". scripts/lib.sh && build_{lang}_plugins")])
            .current_dir(workspace_dir())
            .env("KAIROS_NO_INSTALL", "1")
            .output()
            .map_err(|e| format!("cannot run bash: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = built {
        panic!("cannot build the {lang} plugins: {e}");
    }
    let file = workspace_dir().join(format!(
        "target-plugins/{lang}/{lang}_{}.wasm",
        name.replace('-', "_")
    ));
    std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Uploads a plugin component as `name` with the given query (`allowed_hosts=...&...`);
/// the host must answer 201. Returns the registered version's description.
pub async fn upload_plugin(api: &Api, name: &str, crate_name: &str, query: &str) -> Value {
    upload_component(api, name, plugin_wasm(crate_name), query).await
}

/// Uploads the component `wasm` as `name` with the given query; the host must answer 201
/// (compiled) or 202 (still compiling: a large component, or a loaded machine) with its
/// size. Returns the registered version's description once it is ready.
pub async fn upload_component(api: &Api, name: &str, wasm: Vec<u8>, query: &str) -> Value {
    let size = wasm.len();
    let (status, reply) = api
        .put_wasm(&format!("/plugins/{name}?{query}"), wasm)
        .await;
    assert!(
        status == 201 || status == 202,
        "upload of {name} refused: {status} {reply:#}"
    );
    assert_eq!(reply["size"], size, "{reply:#}");
    if status == 201 {
        assert_eq!(reply["state"], "ready", "{reply:#}");
        return reply;
    }
    assert_eq!(reply["state"], "compiling", "{reply:#}");
    wait_plugin_ready(api, name, &reply).await
}

/// Waits for the version `uploaded` describes to end its compile; its description then.
pub async fn wait_plugin_ready(api: &Api, name: &str, uploaded: &Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, shown) = api.get(&format!("/plugins/{name}")).await;
        assert_eq!(status, 200, "{shown:#}");
        let version = shown["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["version"] == uploaded["version"]))
            .cloned()
            .unwrap_or(Value::Null);
        match version["state"].as_str() {
            Some("ready") => return version,
            Some("failed") => panic!("{name} failed to compile: {version:#}"),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "{name} still compiling after 90 s: {shown:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `kairos {args}` to its end; (exit code, stdout, stderr).
pub fn kairos_command(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(kairos_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("kairos runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kairos migrate` against `redis` (a keyspace written before shards); panics unless it
/// succeeds, returns what it printed.
pub fn migrate(redis: &RedisServer) -> String {
    let (code, out, err) = kairos_command(&["migrate", "--redis-url", &redis.url()]);
    assert_eq!(code, 0, "kairos migrate failed: {out}{err}");
    out
}

/// A running `kairos serve` process.
pub struct Host {
    pub addr: SocketAddr,
    pub host_id: String,
    child: Option<Child>,
    pub log: PathBuf,
    _logdir: TempDir,
}

/// Flags for short test timings: claims every 100 ms at most, a 2 s lease, a 500 ms
/// execution guard, a 1 s minimum term.
pub fn fast_flags() -> Vec<String> {
    [
        "--booking-plan-watch-interval",
        "100ms",
        "--lease-ttl",
        "2s",
        "--execution-guard-time",
        "500ms",
        "--minimum-life-term",
        "1s",
        "--execution-delay-guard-time",
        "1s",
        "--death-retry-interval",
        "300ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Host {
    /// Starts a host on a free port against `redis_url` with `args`, and waits for /readyz.
    pub fn start(redis_url: &str, args: &[String]) -> Host {
        Self::start_with_env(redis_url, args, &[])
    }

    pub fn start_with_env(redis_url: &str, args: &[String], env: &[(&str, &str)]) -> Host {
        Self::start_full(redis_url, args, env, &shared_data_dir(), None)
    }

    /// Starts a host with a host id of the test's choosing (a restart under the same id).
    pub fn start_with_id(redis_url: &str, args: &[String], host_id: &str) -> Host {
        Self::start_full(redis_url, args, &[], &shared_data_dir(), Some(host_id))
    }

    /// Starts a host whose data directory (and so compiled-plugin cache) is `data_dir`
    /// rather than the shared one, for tests that tamper with the cache.
    pub fn start_in(redis_url: &str, args: &[String], data_dir: &Path) -> Host {
        Self::start_full(redis_url, args, &[], data_dir, None)
    }

    fn start_full(
        redis_url: &str,
        args: &[String],
        env: &[(&str, &str)],
        data_dir: &Path,
        host_id: Option<&str>,
    ) -> Host {
        let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let host_id = host_id
            .map(str::to_string)
            .unwrap_or_else(|| format!("test-host-{}-{n}", std::process::id()));
        Self::start_as(&kairos_bin(), redis_url, args, env, data_dir, &host_id)
    }

    /// Starts the kairos binary `bin` as a host named `host_id` (`--host-id`): a
    /// restarted host may come back under the name it had, as a real deployment's fixed
    /// host names do, or under a new one.
    pub fn start_as(
        bin: &Path,
        redis_url: &str,
        args: &[String],
        env: &[(&str, &str)],
        data_dir: &Path,
        host_id: &str,
    ) -> Host {
        // Port 0: the kernel picks a port no one holds, and the host logs which; a port
        // found free beforehand can be taken by a test running beside this one.
        let host_id = host_id.to_string();
        let logdir = TempDir::new("hostlog");
        let log = logdir.0.join("kairos.log");
        let logfile = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .args([
                "--redis-url",
                redis_url,
                "--listen",
                "127.0.0.1:0",
                "--host-id",
                &host_id,
                "--data-dir",
                &data_dir.display().to_string(),
            ])
            .args(args)
            .env(
                "RUST_LOG",
                HOST_LOG.get().copied().unwrap_or("info,kairos=debug"),
            )
            .stdout(Stdio::null())
            .stderr(logfile);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("kairos starts");
        let mut host = Host {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            host_id,
            child: Some(child),
            log,
            _logdir: logdir,
        };
        host.wait_ready();
        host
    }

    /// Waits until the host logs the address it listens on (`kairos is serving
    /// listen=…`) and that address takes connections.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(addr) = serving_addr(&self.log_text()) {
                if std::net::TcpStream::connect(addr).is_ok() {
                    self.addr = addr;
                    return;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("kairos exited at start ({status}): {}", self.log_text());
                }
            }
            assert!(
                Instant::now() < deadline,
                "kairos did not listen: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The most memory the process has had resident (VmHWM, bytes).
    pub fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid().unwrap()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    }

    /// SIGKILL: no chance to hand anything back.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id, while the process is ours to signal.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (a name `kill` accepts: `STOP`, `CONT`, `TERM`...) to the process;
    /// returns whether it was delivered.
    pub fn signal(&self, signal: &str) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The exit status if the process has ended on its own (None while it runs or after
    /// `kill9`/`terminate` took it).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM, then waits for the process to exit; returns whether it exited in time.
    pub fn terminate(&mut self, within: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A JSON-over-HTTP client for the API (keep-alive, optional bearer token).
#[derive(Clone)]
pub struct Api {
    base: String,
    token: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Status and parsed JSON body (Null when the body is not JSON).
pub type Reply = (u16, Value);

impl Api {
    pub fn new(host: &Host) -> Api {
        Api::at(&format!("http://{}", host.addr))
    }

    pub fn at(base: &str) -> Api {
        Api {
            base: base.to_string(),
            token: None,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn with_token(&self, token: &str) -> Api {
        Api {
            token: Some(token.to_string()),
            ..self.clone()
        }
    }

    /// `PUT path` with `wasm` as an `application/wasm` body: a plugin upload, whatever the
    /// host answers.
    pub async fn put_wasm(&self, path: &str, wasm: Vec<u8>) -> Reply {
        self.raw(
            Method::PUT,
            path,
            wasm,
            &[("content-type", "application/wasm")],
        )
        .await
    }

    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let (status, _, body) = self.call(method, path, body, headers).await;
        (status, body)
    }

    /// Like `raw`, with the answer's headers too.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> (u16, hyper::HeaderMap, Value) {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        if !body.is_empty()
            && !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/json");
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("request reaches kairos");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Like `raw`, but a connection error or no answer within `within` is an `Err` with
    /// the reason instead of a panic: for clients that keep going while hosts or Redis
    /// are being killed.
    pub async fn try_raw(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        within: Duration,
    ) -> Result<Reply, String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ))
        };
        match tokio::time::timeout(within, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {within:?}")),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.raw(Method::POST, path, serde_json::to_vec(body).unwrap(), &[])
            .await
    }
    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.raw(Method::PUT, path, serde_json::to_vec(body).unwrap(), &[])
            .await
    }
    pub async fn patch(&self, path: &str, body: &Value) -> Reply {
        self.raw(Method::PATCH, path, serde_json::to_vec(body).unwrap(), &[])
            .await
    }
    pub async fn get(&self, path: &str) -> Reply {
        self.raw(Method::GET, path, Vec::new(), &[]).await
    }
    /// `kairos_shards_owned` from the host's /metrics (0 when absent).
    pub async fn shards_owned(&self) -> i64 {
        let (_, text) = self.text("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix("kairos_shards_owned "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
    /// GET of a text answer (such as /metrics): status and body.
    pub async fn text(&self, path: &str) -> (u16, String) {
        let mut req = hyper::Request::builder().uri(format!("{}{}", self.base, path));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .expect("request reaches kairos");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.raw(Method::DELETE, path, Vec::new(), &[]).await
    }

    /// Polls GET /schedules/{id} until `check` holds; panics with the last view after `within`.
    pub async fn wait_life(
        &self,
        id: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, life) = self.get(&format!("/schedules/{id}")).await;
            if status == 200 && check(&life) {
                return life;
            }
            assert!(
                Instant::now() < deadline,
                "Life {id} did not reach the expected state: {life:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// RFC 3339 (UTC, ms) of now + `ms`.
pub fn at_ms_from_now(ms: i64) -> String {
    let t = chrono::Utc::now() + chrono::Duration::milliseconds(ms);
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A request the sink received.
#[derive(Debug, Clone)]
pub struct Received {
    pub at_ms: i64,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: HashMap<String, String>,
    pub body: Bytes,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct SinkState {
    received: Mutex<Vec<Received>>,
    /// Statuses to answer, in order; 200 once empty.
    script: Mutex<VecDeque<u16>>,
    /// Statuses to answer every request to a path with, before the script.
    by_path: Mutex<HashMap<String, u16>>,
    delay: Mutex<Duration>,
    /// `Retry-After` sent with every answer that is not a 2xx.
    retry_after: Mutex<Option<String>>,
    /// Concurrent requests now and the most seen, per X-Kairos-Resource (or "").
    concurrent: Mutex<HashMap<String, (u32, u32)>>,
    /// The same per Idempotency-Key: a Plan run twice at the same time shows as 2.
    per_key: Mutex<HashMap<String, (u32, u32)>>,
}

/// A real HTTP server that records every request and answers scripted statuses.
#[derive(Clone)]
pub struct Sink {
    pub addr: SocketAddr,
    state: Arc<SinkState>,
}

/// One request under way at the sink, per resource and per Idempotency-Key.
struct UnderWay {
    state: Arc<SinkState>,
    resource: String,
    key: String,
}

impl UnderWay {
    fn enter(state: &Arc<SinkState>, resource: String, key: String) -> UnderWay {
        for (map, name) in [(&state.concurrent, &resource), (&state.per_key, &key)] {
            let mut c = map.lock().unwrap();
            let e = c.entry(name.clone()).or_default();
            e.0 += 1;
            e.1 = e.1.max(e.0);
        }
        UnderWay {
            state: state.clone(),
            resource,
            key,
        }
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        let state = &self.state;
        for (map, name) in [
            (&state.concurrent, &self.resource),
            (&state.per_key, &self.key),
        ] {
            if let Some(e) = map.lock().unwrap().get_mut(name) {
                e.0 -= 1;
            }
        }
    }
}

async fn sink_handler(
    State(state): State<Arc<SinkState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let at_ms = now_ms();
    let resource = headers
        .get("x-kairos-resource")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    // Counted out when the handler ends or is dropped (the caller went away mid-call).
    let _under_way = UnderWay::enter(&state, resource, key);
    state.received.lock().unwrap().push(Received {
        at_ms,
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body,
    });
    let by_path = state.by_path.lock().unwrap().get(uri.path()).copied();
    let status = match by_path {
        Some(status) => status,
        None => state.script.lock().unwrap().pop_front().unwrap_or(200),
    };
    let delay = *state.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let retry_after = state
        .retry_after
        .lock()
        .unwrap()
        .clone()
        .filter(|_| !(200..300).contains(&status));
    let mut response = (StatusCode::from_u16(status).unwrap(), "ok").into_response();
    if let Some(value) = retry_after {
        response
            .headers_mut()
            .insert("retry-after", value.parse().unwrap());
    }
    response
}

impl Sink {
    pub async fn start() -> Sink {
        let state = Arc::new(SinkState::default());
        let app = axum::Router::new()
            .fallback(sink_handler)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Sink { addr, state }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next answers, in order (then 200).
    pub fn answer(&self, statuses: &[u16]) {
        self.state
            .script
            .lock()
            .unwrap()
            .extend(statuses.iter().copied());
    }

    /// Answers every request to each path with its status (before the scripted ones).
    pub fn answer_paths(&self, statuses: &[(&str, u16)]) {
        let mut by_path = self.state.by_path.lock().unwrap();
        for (path, status) in statuses {
            by_path.insert(path.to_string(), *status);
        }
    }

    /// Sends `Retry-After: {value}` with every answer that is not a 2xx (None: never).
    pub fn set_retry_after(&self, value: Option<&str>) {
        *self.state.retry_after.lock().unwrap() = value.map(str::to_string);
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap() = delay;
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn received_for(&self, life: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.header("x-kairos-life") == Some(life))
            .collect()
    }

    /// Most requests seen at once for one resource.
    pub fn max_concurrent(&self, resource: &str) -> u32 {
        self.state
            .concurrent
            .lock()
            .unwrap()
            .get(resource)
            .map(|e| e.1)
            .unwrap_or(0)
    }

    /// Idempotency-Keys (Plans) that had two calls under way at the same time.
    pub fn overlapping_runs(&self) -> Vec<String> {
        self.state
            .per_key
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, e)| !k.is_empty() && e.1 > 1)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Waits until at least `n` requests arrived; panics after `within`.
    pub async fn wait_count(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "sink got {} of {n} requests",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// RFC 3339 (UTC, ms) of an instant given in epoch milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("a representable instant")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `base` with some flags replaced, or added when absent:
/// `flags_with(fast_flags(), &[("--lease-ttl", "30s")])`. clap refuses a flag given twice,
/// so overriding a value of `fast_flags()` must go through this.
pub fn flags_with(mut base: Vec<String>, overrides: &[(&str, &str)]) -> Vec<String> {
    for (flag, value) in overrides {
        match base.iter().position(|a| a == flag) {
            Some(i) => base[i + 1] = value.to_string(),
            None => {
                base.push(flag.to_string());
                base.push(value.to_string());
            }
        }
    }
    base
}

impl RedisServer {
    /// The keys under `kairos:` that something booked or stored: all but the keyspace's
    /// own (what it is, who is alive, who owns which shard, and each shard's census
    /// while it holds only its mark `v`, no Life counted).
    pub async fn booked_keys(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("kairos:*")
            .query_async(&mut conn)
            .await
            .expect("KEYS answers");
        let mut out = Vec::new();
        for k in keys {
            if matches!(k.as_str(), "kairos:hosts" | "kairos:meta") || k.ends_with(":owner") {
                continue;
            }
            if k.ends_with(":census") {
                let fields: Vec<String> = redis::cmd("HKEYS")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .expect("HKEYS answers");
                if fields == ["v"] {
                    continue;
                }
            }
            out.push(k);
        }
        out
    }

    /// ZCARD of `key` (0 when it does not exist).
    pub async fn zcard(&self, key: &str) -> i64 {
        let mut conn = self.conn().await;
        redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("ZCARD answers")
    }

    /// The keyspace kairos created here (its number of shards is in `kairos:meta`; 32
    /// before any host has started).
    pub async fn keyspace(&self) -> Keyspace {
        let mut conn = self.conn().await;
        let shards: Option<u32> = redis::cmd("HGET")
            .arg("kairos:meta")
            .arg("shards")
            .query_async(&mut conn)
            .await
            .expect("HGET answers");
        Keyspace::new(shards.unwrap_or(32))
    }

    /// How many entries `rest` holds, added up over every shard: `due` (the Lives' due
    /// tree and the timers' `timers_due`), `lives` (a tree, counted by member),
    /// `finished` (a list), `held` (claimed timers and tasks, and Lives' Plans in
    /// `inflight`), or any other sorted set by ZCARD.
    pub async fn count_all(&self, rest: &str) -> i64 {
        let mut conn = self.conn().await;
        let mut total = 0;
        for k in self.keyspace().await.shards() {
            total += match rest {
                "finished" => redis::cmd("LLEN")
                    .arg(k.finished())
                    .query_async::<i64>(&mut conn)
                    .await
                    .expect("LLEN answers"),
                "due" | "lives" | "task_due" => {
                    let tree = format!("{}{rest}", k.prefix);
                    kairos::store::inspect::tree_members(&mut conn, &tree)
                        .await
                        .expect("the tree reads")
                        .len() as i64
                }
                _ => self.zcard(&format!("{}{rest}", k.prefix)).await,
            };
            total += match rest {
                "due" => self.zcard(&k.timers_due()).await,
                "held" => redis::cmd("HLEN")
                    .arg(k.inflight())
                    .query_async::<i64>(&mut conn)
                    .await
                    .expect("HLEN answers"),
                _ => 0,
            };
        }
        total
    }

    /// The score of `member` in the tree `tree` (such as a shard's `due`), if it is there.
    pub async fn tree_score(&self, tree: &str, member: &str) -> Option<i64> {
        kairos::store::inspect::tree_members(&mut self.conn().await, tree)
            .await
            .expect("the tree reads")
            .into_iter()
            .find(|(m, _)| m == member)
            .map(|(_, score)| score)
    }

    /// Takes `member` out of the tree `tree` (out of its leaf; the index is left as it
    /// is); whether it was there.
    pub async fn tree_remove(&self, tree: &str, member: &str) -> bool {
        let mut conn = self.conn().await;
        let entries: Vec<String> = redis::cmd("ZRANGE")
            .arg(tree)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("ZRANGE answers");
        for entry in entries {
            let Some((_, leaf)) = entry.rsplit_once('|') else {
                continue;
            };
            let removed: i64 = redis::cmd("ZREM")
                .arg(format!("{tree}:{leaf}"))
                .arg(member)
                .query_async(&mut conn)
                .await
                .expect("ZREM answers");
            if removed == 1 {
                return true;
            }
        }
        false
    }

    /// When Life `uuid` finished, from its entry on shard `k`'s `finished` list, if it is
    /// there.
    pub async fn finished_at(&self, k: &kairos::store::ShardKeys, uuid: &str) -> Option<i64> {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(k.finished())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn().await)
            .await
            .expect("LRANGE answers");
        entries.iter().find_map(|e| {
            let (ms, id) = e.split_once(':')?;
            (id == uuid).then(|| ms.parse().ok()).flatten()
        })
    }

    /// A Life's record and its Plans' `inflight` entries in shard `k`.
    pub async fn life_record(
        &self,
        k: &kairos::store::ShardKeys,
        uuid: &str,
    ) -> Option<(
        kairos::store::record::LifeRecord,
        [Option<kairos::store::record::Inflight>; 2],
    )> {
        kairos::store::inspect::life(&mut self.conn().await, k, uuid)
            .await
            .expect("the Life reads")
    }

    /// Every Life record in shard `k` (all its record buckets), by id.
    pub async fn life_records(
        &self,
        k: &kairos::store::ShardKeys,
    ) -> std::collections::BTreeMap<String, kairos::store::record::LifeRecord> {
        let mut conn = self.conn().await;
        let n: Option<u64> = redis::cmd("GET")
            .arg(k.record_count())
            .query_async(&mut conn)
            .await
            .expect("GET answers");
        let mut out = std::collections::BTreeMap::new();
        for bucket in 0..n.unwrap_or(1) {
            let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(k.records(bucket))
                .query_async(&mut conn)
                .await
                .expect("HGETALL answers");
            for (id, text) in all {
                let record = kairos::store::record::LifeRecord::from_json(&text)
                    .unwrap_or_else(|e| panic!("record of {id} unreadable: {e}: {text}"));
                out.insert(id, record);
            }
        }
        out
    }

    /// A field of any Plan in shard `k`, named as layout 3 named it (`state`,
    /// `fire_at_ms`, `attempts`, `lease_owner`, `claims`, ...: a Life's Plans are rendered
    /// from its record by `LifeRecord::hashes`); None when it is not there.
    pub async fn plan_field(
        &self,
        k: &kairos::store::ShardKeys,
        plan_id: &str,
        field: &str,
    ) -> Option<String> {
        if let Some((uuid, kind)) = plan_id.rsplit_once(':') {
            if kind == "birth" || kind == "death" {
                let (record, inflight) = self.life_record(k, uuid).await?;
                let at = usize::from(kind == "death");
                if field == "claims" {
                    return inflight[at].as_ref().map(|f| f.claim.clone());
                }
                let (life, birth, death) =
                    record.hashes([inflight[0].as_ref(), inflight[1].as_ref()]);
                let plan = if at == 0 { birth } else { death };
                if plan.is_empty() {
                    return None;
                }
                return plan.get(field).or_else(|| life.get(field)).cloned();
            }
        }
        redis::cmd("HGET")
            .arg(k.plan(plan_id))
            .arg(field)
            .query_async(&mut self.conn().await)
            .await
            .expect("HGET answers")
    }

    /// Whether a Plan exists in shard `k` (every Plan has a `state`).
    pub async fn plan_exists(&self, k: &kairos::store::ShardKeys, plan_id: &str) -> bool {
        self.plan_field(k, plan_id, "state").await.is_some()
    }

    /// Plans held (claimed, Preset or Running) in the shards `host` owns: its timers'
    /// and tasks' in `held`, its Lives' in `inflight`.
    pub async fn held_by(&self, host: &str) -> i64 {
        let mut conn = self.conn().await;
        let mut total = 0;
        for k in self.keyspace().await.shards() {
            let owner: Option<String> = redis::cmd("HGET")
                .arg(k.owner())
                .arg("host")
                .query_async(&mut conn)
                .await
                .expect("HGET answers");
            if owner.as_deref() == Some(host) {
                total += self.zcard(&k.held()).await;
                let entries: Vec<String> = redis::cmd("HVALS")
                    .arg(k.inflight())
                    .query_async(&mut conn)
                    .await
                    .expect("HVALS answers");
                total += entries
                    .iter()
                    .filter(|e| e.split('|').nth(2) == Some(host))
                    .count() as i64;
            }
        }
        total
    }
}

impl Sink {
    /// Polls what the sink received until `check` holds; panics with `what` after `within`.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if check(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "sink: {what} did not happen within {within:?} ({} requests received)",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Booking bodies and views shared by the end-to-end tests
// ---------------------------------------------------------------------------------------

/// A webhook to the gateway's `/hook`, tagged so the sink can tell calls apart.
pub fn hook(tag: &str) -> Value {
    serde_json::json!({"path": "/hook", "method": "POST", "body": {"tag": tag}})
}

pub fn point(uuid: &str, at_ms: i64, birth: Value) -> Value {
    serde_json::json!({
        "life_uuid": uuid,
        "schedule_type": "point",
        "birth_time": rfc3339_ms(at_ms),
        "birth": birth,
    })
}

pub fn term(uuid: &str, birth_ms: i64, death_ms: i64, birth: Value, death: Value) -> Value {
    serde_json::json!({
        "life_uuid": uuid,
        "schedule_type": "term",
        "birth_time": rfc3339_ms(birth_ms),
        "death_time": rfc3339_ms(death_ms),
        "birth": birth,
        "death": death,
    })
}

/// Books `body`; the host must acknowledge it with 200.
pub async fn book(api: &Api, body: &Value) {
    let (status, reply) = api.post("/schedules", body).await;
    assert_eq!(status, 200, "booking refused: {reply:#}\nbody: {body:#}");
}

/// `fast_flags()` with the sink as gateway, plus `extra` overrides.
pub fn flags(sink: &Sink, extra: &[(&str, &str)]) -> Vec<String> {
    let gateway = sink.base_url();
    let mut all = vec![("--gateway-url", gateway.as_str())];
    all.extend_from_slice(extra);
    flags_with(fast_flags(), &all)
}

pub fn state(life: &Value) -> &str {
    life["state"].as_str().unwrap_or("")
}

pub fn plan<'a>(life: &'a Value, kind: &str) -> &'a Value {
    life["plans"]
        .as_array()
        .and_then(|plans| plans.iter().find(|p| p["kind"] == kind))
        .unwrap_or_else(|| panic!("Life has no {kind} Plan: {life:#}"))
}

pub fn history(life: &Value) -> Vec<Value> {
    life["history"].as_array().cloned().unwrap_or_default()
}

/// A Life's view, or a page of them, as builds before Life outcomes (issue 29) showed
/// it, for comparing with their fixtures: `outcome`, `outcome_reason` and `finished_at`
/// taken out once checked against what they are read from (the state, the Plans, the
/// finish time), and a page's `total` taken out.
pub fn as_before_outcomes(view: &Value) -> Value {
    let mut view = view.clone();
    if let Some(items) = view.get_mut("items").and_then(Value::as_array_mut) {
        for item in items.iter_mut() {
            *item = as_before_outcomes(item);
        }
        view.as_object_mut().unwrap().remove("total");
        return view;
    }
    let failed = |kind: &str| {
        view["plans"].as_array().is_some_and(|ps| {
            ps.iter()
                .any(|p| p["kind"] == kind && p["state"] == "Failed")
        })
    };
    let allowed: &[&str] = match state(&view) {
        "Dead" if failed("death") => &["death_failed"],
        "Dead" if view["plans"].is_array() => &["succeeded"],
        "Dead" => &["succeeded", "death_failed"],
        "Stillbirth" if failed("birth") => &["birth_failed"],
        "Stillbirth" if view["plans"].is_array() => &["cancelled"],
        "Stillbirth" => &["cancelled", "birth_failed"],
        "Invalidated" => &["invalidated"],
        _ => &[],
    };
    let outcome = view["outcome"].as_str();
    assert!(
        match outcome {
            Some(o) => allowed.contains(&o),
            None => allowed.is_empty() && view.get("outcome").is_some(),
        },
        "outcome {outcome:?} of a Life whose state and Plans allow {allowed:?}: {view:#}"
    );
    assert_eq!(
        view["finished_at"].is_string(),
        view["finished_at_ms"].is_i64(),
        "finished_at beside finished_at_ms: {view:#}"
    );
    let fields = view.as_object_mut().unwrap();
    for name in ["outcome", "outcome_reason", "finished_at"] {
        fields.remove(name);
    }
    view
}
