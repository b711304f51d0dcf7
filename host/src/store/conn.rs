//! The connection to Redis: one redis-server through a self-reconnecting multiplexed
//! connection, or a Redis Cluster through the redis crate's cluster client, which routes
//! each command (and each script, by its first key) to the master of its slot and
//! follows slot moves and failovers.
//!
//! A cluster is named by `redis+cluster://[user:password@]host:port,host:port,...` (any
//! of its nodes; the rest are discovered). Every pipeline kairos sends touches one shard,
//! so one slot: a cluster refuses a pipeline that spans slots.
//!
//! **The shards' slots go their own way.** The cluster client makes every request of a
//! connection wait while it recovers from a failed node, to whichever master it goes: a
//! master that died stopped every shard on every master. So the commands and scripts of
//! the shards' slots ([`Conn::dedicate`]) go through `slot_router.rs`, a plain
//! connection to each slot's master, and a failing master delays only its own shards;
//! everything else (the registry, `hosts`, `meta`, commands without a key) goes through
//! the cluster client.
//!
//! The cluster client learns of a failover from a MOVED reply or a lost connection, but
//! a call routed to a master that died is retried against that same dead address until
//! it times out: reads of a failed-over slot could answer 503 for as long as the process
//! lived. So a call that fails with a connection error or a timeout makes the handle
//! open a fresh cluster connection (which reads the slots anew from the nodes), at most
//! once every two seconds; the call itself still fails, and the next ones use the fresh
//! connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::slot_router::SlotRouter;

/// The scheme that names a Redis Cluster in `--redis-url`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// A shared connection; cheap to clone.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<ClusterSet>),
}

/// The connections to a Redis Cluster: the shards' slots through their own router, and
/// the cluster client for everything else.
pub struct ClusterSet {
    general: Arc<ClusterHandle>,
    slots: SlotRouter,
}

impl ClusterSet {
    /// The dedicated slot a command or pipeline goes to, if any.
    fn dedicated(&self, slot: Option<u16>) -> Option<u16> {
        slot.filter(|s| self.slots.is_dedicated(*s))
    }

    async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        if let Some(slot) = self.dedicated(slot_of_cmd(cmd)) {
            return self.slots.send(slot, cmd).await;
        }
        if is_script_load(cmd) {
            // A promoted replica has none of its master's scripts: load them on every
            // node the shards use too (the cluster client sends it to every master it
            // knows, which may not be those yet).
            let _ = self.slots.broadcast(cmd).await;
        }
        let h = &self.general;
        let reply = h.connection().req_packed_command(cmd).await;
        if let Err(e) = &reply {
            h.failed(e);
        }
        reply
    }

    async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if let Some(slot) = self.dedicated(slot_of_pipeline(pipeline)) {
            return self
                .slots
                .send_pipeline(slot, pipeline, offset, count)
                .await;
        }
        let h = &self.general;
        let reply = h
            .connection()
            .req_packed_commands(pipeline, offset, count)
            .await;
        if let Err(e) = &reply {
            h.failed(e);
        }
        reply
    }
}

fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    args.next()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"SCRIPT"))
        && args.next().is_some_and(|a| a.eq_ignore_ascii_case(b"LOAD"))
}

/// The slot a command's key is in: its first argument, or a script's first key; None
/// for the commands kairos sends without a key. Only which connection carries the
/// command depends on it (the cluster client routes each command itself), so a command
/// misread here still reaches its node.
fn slot_of_cmd(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" => {
            let _script = args.next()?;
            if args.next()? == b"0" {
                return None;
            }
            args.next()?
        }
        b"PING" | b"WAIT" | b"INFO" | b"CONFIG" | b"SCRIPT" | b"TIME" | b"CLUSTER" | b"PUBLISH"
        | b"DBSIZE" | b"KEYS" | b"SCAN" | b"MEMORY" | b"OBJECT" | b"XREAD" | b"CLIENT"
        | b"COMMAND" | b"ROLE" => return None,
        _ => args.next()?,
    };
    Some(super::shards::key_slot(key))
}

/// The slot a pipeline goes to: its first command with a key (a pipeline spans one slot).
fn slot_of_pipeline(pipeline: &Pipeline) -> Option<u16> {
    pipeline.cmd_iter().find_map(slot_of_cmd)
}

/// A cluster connection that is replaced by a fresh one after connection errors.
pub struct ClusterHandle {
    client: redis::cluster::ClusterClient,
    current: RwLock<ClusterConnection>,
    /// When the last fresh connection was asked for, in ms since `born`.
    last_reset_ms: AtomicU64,
    born: Instant,
}

/// The least time between two fresh cluster connections.
const CLUSTER_RESET_EVERY: Duration = Duration::from_secs(2);

impl ClusterHandle {
    fn new(client: redis::cluster::ClusterClient, first: ClusterConnection) -> ClusterHandle {
        ClusterHandle {
            client,
            current: RwLock::new(first),
            last_reset_ms: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    fn connection(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// After a failed call: if the failure says a node is gone or not answering, opens
    /// a fresh connection in the background (at most every CLUSTER_RESET_EVERY).
    fn failed(self: &Arc<Self>, err: &redis::RedisError) {
        let node_trouble = err.is_timeout()
            || err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal();
        if !node_trouble {
            return;
        }
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_reset_ms.load(Ordering::Acquire);
        let every = CLUSTER_RESET_EVERY.as_millis() as u64;
        if last != 0 && now.saturating_sub(last) < every {
            return;
        }
        if self
            .last_reset_ms
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let handle = self.clone();
        tokio::spawn(async move {
            match handle.client.get_async_connection().await {
                Ok(fresh) => {
                    *handle
                        .current
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
                    tracing::info!("opened a fresh Redis Cluster connection after a node failed");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a fresh Redis Cluster connection")
                }
            }
        });
    }
}

/// Where to connect, as parsed from `--redis-url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Single(String),
    /// `redis://` URLs of the nodes given.
    Cluster(Vec<String>),
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, String> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(Target::Single(url.to_string()));
        };
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let nodes: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.trim().is_empty())
            .map(|h| format!("redis://{auth}{}", h.trim()))
            .collect();
        if nodes.is_empty() {
            return Err(format!(
                "`{url}` names no node: write {CLUSTER_SCHEME}host:port,host:port"
            ));
        }
        Ok(Target::Cluster(nodes))
    }

    /// Each node's URL (one for a single server).
    pub fn nodes(&self) -> Vec<String> {
        match self {
            Target::Single(url) => vec![url.clone()],
            Target::Cluster(nodes) => nodes.clone(),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }
}

impl Conn {
    pub async fn open(target: &Target) -> RedisResult<Conn> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(10)))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_millis(500));
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(10))
                    .retries(6)
                    .max_retry_wait(1000)
                    .build()?;
                let first = client.get_async_connection().await?;
                Ok(Conn::Cluster(Arc::new(ClusterSet {
                    general: Arc::new(ClusterHandle::new(client, first)),
                    slots: SlotRouter::new(nodes),
                })))
            }
        }
    }

    /// Routes the commands of each of `slots` (the shards') on their own (see the module
    /// docs); nothing on one server.
    pub fn dedicate(&self, slots: impl IntoIterator<Item = u16>) {
        if let Conn::Cluster(set) = self {
            set.slots.dedicate(slots);
        }
    }

    /// Sends `cmd` to the master of `slot` (a cluster); on one server, just sends it.
    /// For commands without a key that must reach a shard's node, such as WAIT.
    pub async fn on_slot(&mut self, slot: u16, cmd: Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(set) if set.slots.is_dedicated(slot) => set.slots.send(slot, &cmd).await,
            Conn::Cluster(set) => {
                let h = &set.general;
                let route = redis::cluster_routing::Route::new(
                    slot,
                    redis::cluster_routing::SlotAddr::Master,
                );
                let reply = h
                    .connection()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await;
                if let Err(e) = &reply {
                    h.failed(e);
                }
                reply
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(set) => Box::pin(set.send(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(set) => Box::pin(set.send_pipeline(cmd, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(set) => set.general.connection().get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_node() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/0").unwrap(),
            Target::Single("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            Target::parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            Target::Cluster(vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ])
        );
        assert_eq!(
            Target::parse("redis+cluster://:secret@h1:7000,h2:7000/").unwrap(),
            Target::Cluster(vec![
                "redis://:secret@h1:7000".into(),
                "redis://:secret@h2:7000".into()
            ])
        );
        assert!(Target::parse("redis+cluster://").is_err());
    }
}
