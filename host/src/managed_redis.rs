//! The redis-server that `kairos serve` starts when no `redis_url` is configured.
//!
//! It listens only on a unix socket inside the data directory (no port to collide with,
//! nothing reachable from the network), keeps an append-only file there (`appendfsync
//! everysec`, or `always` with `--durability always`), never evicts keys
//! (`maxmemory-policy noeviction` under a `maxmemory` of half this machine's memory
//! unless `--redis-maxmemory` says otherwise), and is restarted if it exits. If a previous kairos was killed and left its
//! redis-server running on that socket, the new kairos adopts it instead of starting a
//! second server on the same files, and supervises it too: if it stops answering, a new
//! one is started on its data.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// `hash-max-listpack-value` of the redis-server kairos runs: Life hashes hold actions and
/// run records of a few hundred bytes and stay in the compact encoding up to this.
pub const LISTPACK_VALUE: u64 = 1024;

/// How the managed redis-server keeps its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `maxmemory`, as redis-server reads it (`512mb`); None: no limit.
    pub maxmemory: Option<String>,
    /// `appendfsync`: `everysec` or `always`.
    pub appendfsync: String,
}

impl Settings {
    /// `maxmemory` as asked, or half of this machine's memory.
    pub fn new(maxmemory: Option<String>, appendfsync: &str) -> Settings {
        Settings {
            maxmemory: maxmemory.or_else(|| half_of_memory().map(|b| b.to_string())),
            appendfsync: appendfsync.to_string(),
        }
    }

    /// The same, as `CONFIG SET` arguments (for a server adopted from an earlier run).
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("maxmemory-policy", "noeviction".to_string()),
            (
                "maxmemory",
                self.maxmemory.clone().unwrap_or_else(|| "0".into()),
            ),
            ("appendfsync", self.appendfsync.clone()),
        ]
    }
}

/// Half of `MemTotal` in /proc/meminfo, in bytes.
fn half_of_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024 / 2)
}

/// A running redis-server owned (or adopted) by this host.
pub struct ManagedRedis {
    /// The URL clients connect with (`redis+unix://…`).
    pub url: String,
    /// Where its socket, append-only file and log live.
    pub data_dir: PathBuf,
    /// The supervising task; taken by `stop`.
    stop: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

/// Asks the server at `url` to write its append-only file and exit.
async fn shutdown(url: &str) {
    if let Ok(client) = redis::Client::open(url) {
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
            // SHUTDOWN closes the connection instead of answering.
            let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut conn).await;
        }
    }
}

fn redis_server_binary() -> String {
    std::env::var("KAIROS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Some(_))
    )
}

fn spawn(data_dir: &Path, socket: &Path, settings: &Settings) -> anyhow::Result<Child> {
    let binary = redis_server_binary();
    let mut command = Command::new(&binary);
    for (name, value) in settings.pairs() {
        command.arg(format!("--{name}")).arg(value);
    }
    command
        .arg("--port")
        .arg("0")
        .arg("--unixsocket")
        .arg(socket)
        .arg("--unixsocketperm")
        .arg("700")
        .arg("--dir")
        .arg(data_dir)
        // everysec (the default): Redis write()s the AOF before it answers, so a crash of
        // redis-server (or of kairos) loses nothing acknowledged; only an OS crash or
        // power loss can lose up to the last second. `always` fsyncs on every
        // event-loop turn before answering.
        .arg("--appendonly")
        .arg("yes")
        .arg("--save")
        .arg("")
        // Life and Plan hashes hold an action's JSON; past 64 bytes (the default) a value turns the
        // whole hash into a hashtable of about twice the memory. Listpacks of a dozen
        // fields up to 1 KiB each stay fast to read and keep a pending booking small.
        .arg("--hash-max-listpack-value")
        .arg(LISTPACK_VALUE.to_string())
        .arg("--logfile")
        .arg(data_dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "cannot start `{binary}`: install it (`apt-get install -y redis-server`) or give --redis-url"
            )
        })
}

/// Gives an adopted server this host's settings.
async fn configure(url: &str, settings: &Settings) -> anyhow::Result<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for (name, value) in settings.pairs() {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(&value)
            .query_async::<()>(&mut conn)
            .await
            .with_context(|| format!("cannot set {name} {value} on the adopted redis-server"))?;
    }
    Ok(())
}

async fn wait_ready(url: &str, child: &mut Child, data_dir: &Path) -> anyhow::Result<()> {
    for _ in 0..200 {
        if ping(url).await {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(data_dir.join("redis.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "redis-server exited at start ({status}); its log ends: {}",
                tail.join(" | ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "redis-server did not answer within 10 s (see {})",
        data_dir.join("redis.log").display()
    )
}

impl ManagedRedis {
    /// Starts (or adopts) the server and waits until it answers.
    pub async fn start(data_dir: &Path, settings: Settings) -> anyhow::Result<ManagedRedis> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
        let data_dir = data_dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
        let socket = data_dir.join("redis.sock");
        if socket.as_os_str().len() > 100 {
            bail!(
                "the socket path {} is too long for a unix socket; choose a shorter --data-dir",
                socket.display()
            );
        }
        let url = format!("redis+unix://{}", socket.display());
        let server = if socket.exists() && ping(&url).await {
            tracing::warn!(socket = %socket.display(), "a redis-server from an earlier run still serves this data directory; adopting it (it is supervised, and stops with this host)");
            configure(&url, &settings).await?;
            Server::Adopted
        } else {
            let _ = std::fs::remove_file(&socket);
            let mut child = spawn(&data_dir, &socket, &settings)?;
            wait_ready(&url, &mut child, &data_dir).await?;
            Server::Child(child)
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(
            server,
            settings,
            data_dir.clone(),
            socket,
            url.clone(),
            stop_rx,
        ));
        Ok(ManagedRedis {
            url,
            data_dir,
            stop: Some((stop_tx, task)),
        })
    }

    /// Asks the server to write its append-only file and exit, and waits for it.
    pub async fn stop(mut self) {
        if let Some((stop_tx, task)) = self.stop.take() {
            let _ = stop_tx.send(true);
            let _ = task.await;
        }
    }
}

/// The server being supervised: this process's child, or one adopted from an earlier run
/// (not a child, so watched by pinging it).
enum Server {
    Child(Child),
    Adopted,
}

/// Pause between two pings of an adopted server; three failures in a row start a new one.
const ADOPTED_PING_EVERY: Duration = Duration::from_millis(500);
/// Longest pause between two attempts to start a server that would not start.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Keeps the server up until `stop`: restarts a child that exits, replaces an adopted
/// server that stops answering, and keeps trying (with a growing pause) when a start
/// fails, so that the host recovers by itself once the cause is gone.
async fn supervise(
    mut server: Server,
    settings: Settings,
    data_dir: PathBuf,
    socket: PathBuf,
    url: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(500);
    let mut misses = 0;
    loop {
        let gone = match &mut server {
            Server::Child(child) => tokio::select! {
                status = child.wait() => {
                    tracing::error!(status = ?status, "the managed redis-server exited; restarting it");
                    true
                }
                _ = stop.changed() => {
                    shutdown(&url).await;
                    if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                        let _ = child.kill().await;
                    }
                    return;
                }
            },
            Server::Adopted => tokio::select! {
                _ = tokio::time::sleep(ADOPTED_PING_EVERY) => {
                    misses = if ping(&url).await { 0 } else { misses + 1 };
                    if misses >= 3 {
                        tracing::error!("the adopted redis-server stopped answering; starting a new one on its data");
                    }
                    misses >= 3
                }
                _ = stop.changed() => {
                    shutdown(&url).await;
                    for _ in 0..100 {
                        if !ping(&url).await {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    return;
                }
            },
        };
        if !gone {
            continue;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            let _ = std::fs::remove_file(&socket);
            match spawn(&data_dir, &socket, &settings) {
                Ok(mut child) => match wait_ready(&url, &mut child, &data_dir).await {
                    Ok(()) => {
                        tracing::info!("the managed redis-server is back");
                        server = Server::Child(child);
                        backoff = Duration::from_millis(500);
                        misses = 0;
                        break;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the restarted redis-server is not ready; trying again")
                    }
                },
                Err(e) => tracing::error!(error = %e, "cannot restart redis-server; trying again"),
            }
            backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
        }
    }
}
