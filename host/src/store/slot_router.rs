//! The shards' slots of a Redis Cluster, each reached through a plain connection to the
//! node that serves it.
//!
//! The redis crate's cluster client keeps a connection to every node in each cluster
//! connection, and when one node goes away it refreshes the slot map and reconnects
//! while every request of that cluster connection waits, to whichever node it goes:
//! one master killed made every shard on every master late by the whole failover (about
//! 3 s here), even with a cluster connection per shard. A shard is one slot, so routing
//! it needs no more than the address of that slot's master: each dedicated slot keeps
//! the node it was last found on, every node one multiplexed connection, and a slot is
//! looked up again (`CLUSTER SLOTS`, from any node that answers) only when its node
//! fails, answers MOVED (followed at once, and the command sent there: MOVED means it
//! was not run), or says the cluster is down for it. A master that dies costs the
//! commands of its own slots a refused connection each, until its replica takes over;
//! nothing else waits on it.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

/// Longest wait to connect to a node, or for one node's `CLUSTER SLOTS`.
const NODE_PATIENCE: Duration = Duration::from_secs(1);
/// Longest wait for a reply (a script may run long; a dead node is found by its refused
/// or dropped connection long before this).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Least time between two lookups of the slots, however many commands fail meanwhile.
const RELOOK_EVERY: Duration = Duration::from_millis(100);

/// What a reply says about where its slot is.
enum Redirect {
    /// MOVED: another node serves the slot now.
    Moved(String),
    /// CLUSTERDOWN, TRYAGAIN, MASTERDOWN: look the slot up again before the next command.
    Stale,
    None,
}

fn redirect_of(value: &Value) -> Redirect {
    let Value::ServerError(e) = value else {
        return Redirect::None;
    };
    match e.kind() {
        Some(ServerErrorKind::Moved) => e
            .details()
            .and_then(|d| d.split_ascii_whitespace().nth(1))
            .map(|addr| Redirect::Moved(addr.to_string()))
            .unwrap_or(Redirect::Stale),
        Some(ServerErrorKind::ClusterDown)
        | Some(ServerErrorKind::TryAgain)
        | Some(ServerErrorKind::MasterDown)
        | Some(ServerErrorKind::Ask) => Redirect::Stale,
        _ => Redirect::None,
    }
}

fn node_trouble(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// The dedicated slots of one cluster and their nodes.
pub(crate) struct SlotRouter {
    /// `user:password@` of the URL given, for the nodes found in the cluster.
    auth: String,
    /// `host:port` of the nodes named in the URL.
    seeds: Vec<String>,
    /// Each dedicated slot's node (`host:port`), None until found (or after it failed).
    routes: RwLock<HashMap<u16, Option<String>>>,
    nodes: Mutex<HashMap<String, MultiplexedConnection>>,
    /// One lookup of the slots at a time, and when the last one ended.
    looking: tokio::sync::Mutex<Option<Instant>>,
}

impl SlotRouter {
    /// A router for the cluster whose nodes `urls` names (`redis://[auth@]host:port`).
    pub(crate) fn new(urls: &[String]) -> SlotRouter {
        let strip = |url: &str| url.trim_start_matches("redis://").to_string();
        let first = urls.first().map(|u| strip(u)).unwrap_or_default();
        let auth = first
            .rsplit_once('@')
            .map(|(auth, _)| format!("{auth}@"))
            .unwrap_or_default();
        let seeds = urls
            .iter()
            .map(|u| {
                let rest = strip(u);
                rest.rsplit_once('@')
                    .map(|(_, node)| node.to_string())
                    .unwrap_or(rest)
            })
            .collect();
        SlotRouter {
            auth,
            seeds,
            routes: RwLock::new(HashMap::new()),
            nodes: Mutex::new(HashMap::new()),
            looking: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn dedicate(&self, slots: impl IntoIterator<Item = u16>) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        for slot in slots {
            routes.entry(slot).or_insert(None);
        }
    }

    pub(crate) fn is_dedicated(&self, slot: u16) -> bool {
        self.routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&slot)
    }

    fn route(&self, slot: u16) -> Option<String> {
        self.routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&slot)
            .cloned()
            .flatten()
    }

    fn set_route(&self, slot: u16, node: Option<String>) {
        if let Some(route) = self
            .routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&slot)
        {
            *route = node;
        }
    }

    /// Sends a command to a dedicated slot's node.
    pub(crate) async fn send(&self, slot: u16, cmd: &Cmd) -> RedisResult<Value> {
        self.send_with(
            slot,
            |mut conn| async move { conn.req_packed_command(cmd).await },
            redirect_of,
        )
        .await
    }

    /// Sends a pipeline to a dedicated slot's node.
    pub(crate) async fn send_pipeline(
        &self,
        slot: u16,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.send_with(
            slot,
            |mut conn| async move { conn.req_packed_commands(pipeline, offset, count).await },
            |replies: &Vec<Value>| {
                replies
                    .iter()
                    .map(redirect_of)
                    .find(|r| !matches!(r, Redirect::None))
                    .unwrap_or(Redirect::None)
            },
        )
        .await
    }

    async fn send_with<T, F, Fut>(
        &self,
        slot: u16,
        mut send: F,
        redirect: impl Fn(&T) -> Redirect,
    ) -> RedisResult<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let mut followed = false;
        loop {
            let node = match self.route(slot) {
                Some(node) => node,
                None => self.look_up(slot).await?,
            };
            let conn = match self.connection(&node).await {
                Ok(conn) => conn,
                Err(e) => {
                    self.set_route(slot, None);
                    return Err(e);
                }
            };
            match send(conn).await {
                Ok(reply) => match redirect(&reply) {
                    Redirect::None => return Ok(reply),
                    Redirect::Moved(to) => {
                        self.set_route(slot, Some(to));
                        if followed {
                            return Ok(reply);
                        }
                        followed = true;
                    }
                    Redirect::Stale => {
                        self.set_route(slot, None);
                        return Ok(reply);
                    }
                },
                Err(e) => {
                    if node_trouble(&e) {
                        self.forget_node(&node);
                        self.set_route(slot, None);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Sends a command to every node this router has a connection to (`SCRIPT LOAD`:
    /// a promoted replica has none of the scripts its master had); the first answer.
    pub(crate) async fn broadcast(&self, cmd: &Cmd) -> Option<RedisResult<Value>> {
        let conns: Vec<MultiplexedConnection> = self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let sends = conns
            .into_iter()
            .map(|mut conn| async move { conn.req_packed_command(cmd).await });
        let mut first = None;
        for reply in futures_util::future::join_all(sends).await {
            if first.is_none() || matches!(first, Some(Err(_))) {
                first = Some(reply);
            }
        }
        first
    }

    /// The connection to a node, made if needed.
    async fn connection(&self, node: &str) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
        {
            return Ok(conn.clone());
        }
        let client = redis::Client::open(format!("redis://{}{node}", self.auth))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(NODE_PATIENCE))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_string(), conn.clone());
        Ok(conn)
    }

    fn forget_node(&self, node: &str) {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node);
    }

    /// Finds the node of `slot` (and of every dedicated slot) with `CLUSTER SLOTS`, asked
    /// of the nodes already connected, then of those named in the URL, the first that
    /// answers within a second.
    async fn look_up(&self, slot: u16) -> RedisResult<String> {
        let mut last = self.looking.lock().await;
        if let Some(node) = self.route(slot) {
            // Another command looked it up meanwhile.
            return Ok(node);
        }
        if last.is_some_and(|at| at.elapsed() < RELOOK_EVERY) {
            return Err(no_node(slot));
        }
        let mut candidates: Vec<String> = self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut map = None;
        for node in candidates {
            let asked = tokio::time::timeout(NODE_PATIENCE, async {
                let mut conn = self.connection(&node).await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
            })
            .await;
            match asked {
                Ok(Ok(reply)) => {
                    map = Some(masters_of(&reply));
                    break;
                }
                Ok(Err(e)) if node_trouble(&e) => self.forget_node(&node),
                Err(_) => self.forget_node(&node),
                Ok(Err(_)) => {}
            }
        }
        *last = Some(Instant::now());
        let Some(ranges) = map else {
            return Err(no_node(slot));
        };
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        for (s, route) in routes.iter_mut() {
            if let Some((_, _, node)) = ranges.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(s)) {
                *route = Some(node.clone());
            }
        }
        routes
            .get(&slot)
            .cloned()
            .flatten()
            .ok_or_else(|| no_node(slot))
    }
}

/// No node to send to: a refused connection, as to a node that is down (nothing was
/// sent, so nothing can have been applied).
fn no_node(slot: u16) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("no node of the cluster serves slot {slot} now"),
    ))
}

/// The master of each range of slots in a `CLUSTER SLOTS` reply: (first, last, host:port).
fn masters_of(reply: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let int = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (lo, hi) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = match master.get(1)? {
                Value::Int(n) => *n,
                _ => return None,
            };
            Some((lo, hi, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_slots_reply_gives_each_range_its_master() {
        let node = |host: &str, port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000, "a"),
                node("127.0.0.1", 7003, "d"),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001, "b"),
            ]),
        ]);
        assert_eq!(
            masters_of(&reply),
            vec![
                (0, 5460, "127.0.0.1:7000".to_string()),
                (5461, 16383, "10.0.0.2:7001".to_string())
            ]
        );
        assert!(masters_of(&Value::Nil).is_empty());
    }

    #[test]
    fn urls_give_the_seeds_and_their_credentials() {
        let r = SlotRouter::new(&[
            "redis://:secret@h1:7000".to_string(),
            "redis://:secret@h2:7001".to_string(),
        ]);
        assert_eq!(r.auth, ":secret@");
        assert_eq!(r.seeds, ["h1:7000", "h2:7001"]);
        let plain = SlotRouter::new(&["redis://127.0.0.1:7000".to_string()]);
        assert_eq!(plain.auth, "");
        assert_eq!(plain.seeds, ["127.0.0.1:7000"]);
    }
}
