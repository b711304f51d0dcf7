//! The redis-server that `kairos serve` starts when no `redis_url` is configured.
//!
//! It listens only on a unix socket inside the data directory (no port to collide with,
//! nothing reachable from the network), keeps an append-only file there (`appendfsync
//! everysec`), and is restarted if it exits. If a previous kairos was killed and left its
//! redis-server running on that socket, the new kairos adopts it instead of starting a
//! second server on the same files.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// A running redis-server owned (or adopted) by this host.
pub struct ManagedRedis {
    /// The URL clients connect with (`redis+unix://…`).
    pub url: String,
    /// Where its socket, append-only file and log live.
    pub data_dir: PathBuf,
    /// The supervising task of a server this host started; None for an adopted one.
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

fn spawn(data_dir: &Path, socket: &Path) -> anyhow::Result<Child> {
    let binary = redis_server_binary();
    Command::new(&binary)
        .arg("--port")
        .arg("0")
        .arg("--unixsocket")
        .arg(socket)
        .arg("--unixsocketperm")
        .arg("700")
        .arg("--dir")
        .arg(data_dir)
        .arg("--appendonly")
        .arg("yes")
        // everysec: Redis write()s the AOF before it answers, so a crash of redis-server
        // (or of kairos) loses nothing acknowledged; only an OS crash or power loss can
        // lose up to the last second. `always` would fsync on every event-loop turn.
        .arg("--appendfsync")
        .arg("everysec")
        .arg("--save")
        .arg("")
        // Plan hashes hold an action's JSON; past 64 bytes (the default) a value turns the
        // whole hash into a hashtable of about twice the memory. Listpacks of a dozen
        // fields up to 1 KiB each stay fast to read and keep a pending booking small.
        .arg("--hash-max-listpack-value")
        .arg("1024")
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
    pub async fn start(data_dir: &Path) -> anyhow::Result<ManagedRedis> {
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
        if socket.exists() && ping(&url).await {
            tracing::warn!(socket = %socket.display(), "a redis-server from an earlier run still serves this data directory; adopting it (it stops with this host)");
            return Ok(ManagedRedis {
                url,
                data_dir,
                stop: None,
            });
        }
        let _ = std::fs::remove_file(&socket);
        let mut child = spawn(&data_dir, &socket)?;
        wait_ready(&url, &mut child, &data_dir).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(
            child,
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

    /// Asks the server to write its append-only file and exit, and waits for it. An
    /// adopted server (not this process's child) is stopped the same way, and waited for
    /// until its socket stops answering.
    pub async fn stop(mut self) {
        match self.stop.take() {
            Some((stop_tx, task)) => {
                let _ = stop_tx.send(true);
                let _ = task.await;
            }
            None => {
                shutdown(&self.url).await;
                for _ in 0..100 {
                    if !ping(&self.url).await {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn supervise(
    mut child: Child,
    data_dir: PathBuf,
    socket: PathBuf,
    url: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            status = child.wait() => {
                tracing::error!(status = ?status, "the managed redis-server exited; restarting it");
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = std::fs::remove_file(&socket);
                match spawn(&data_dir, &socket) {
                    Ok(mut c) => {
                        if let Err(e) = wait_ready(&url, &mut c, &data_dir).await {
                            tracing::error!(error = %e, "the restarted redis-server is not ready");
                        }
                        child = c;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot restart redis-server");
                        return;
                    }
                }
            }
            _ = stop.changed() => {
                shutdown(&url).await;
                if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                    let _ = child.kill().await;
                }
                return;
            }
        }
    }
}
