//! `--min-replicas-ack N`: a change is answered only once N replicas of the master that
//! holds it have it.
//!
//! `WAIT` confirms the writes of the connection it is sent on, on the node it reaches. Sent
//! on its own after a booking, it could reach another node than the booking did (a
//! failover moved the slot, the cluster client reconnected) and confirm nothing about
//! the booking: bookings were answered 200 while their promoted master had no replica. And
//! `WAIT` holds its connection for up to its timeout, so on the connection every other
//! call of the shard uses, one `WAIT` at a time stalled claims and starts behind it.
//!
//! So each lane (one per shard on a cluster; one for a single server, which is one master)
//! sends, on connections of its own, one pipeline per round: a script
//! (`replica_probe.lua`) that checks that every change waiting for confirmation is on the
//! node (its [`Proof`]) and writes a mark there, then `WAIT`. Both go to the same node in
//! order, so the `WAIT` covers the mark, written after every change it checked: a change
//! found there and confirmed by N replicas is held by N replicas of the master that holds
//! it now, whichever node that is. Changes that arrive during a round wait for the next
//! (group commit): lanes of different shards run at once, and a replica outage costs one
//! timeout per round, not one per booking.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{oneshot, OnceCell};

use super::conn::Conn;
use super::{ShardKeys, Store};
use crate::error::ApiError;

/// The probe script (EVAL: it is small, and a round is one call a shard at most).
static PROBE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    super::script_with(
        include_str!("scripts/record_bucket.lua"),
        include_str!("scripts/replica_probe.lua"),
    )
});

/// Most time a round waits for its replicas (`WAIT`) before its changes are answered 503.
pub(crate) const REPLICA_WAIT_MS: u64 = 2_000;

/// What shows that a change is on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Proof {
    /// A Life's record exists (a booking): the shard's record count key, the Life's id.
    Record(String, String),
    /// One of the record's fields (one letter each) is at least this.
    RecordAtLeast(String, String, &'static str, i64),
}

impl Proof {
    /// Life `uuid`'s record is in the shard of `k`.
    pub(crate) fn record(k: &ShardKeys, uuid: &str) -> Proof {
        Proof::Record(k.record_count(), uuid.to_string())
    }

    /// Life `uuid`'s record has one of `fields` at least `n`.
    pub(crate) fn record_at_least(
        k: &ShardKeys,
        uuid: &str,
        fields: &'static str,
        n: i64,
    ) -> Proof {
        Proof::RecordAtLeast(k.record_count(), uuid.to_string(), fields, n)
    }

    /// The probe's key, field and least value of this proof.
    fn args(&self) -> (&str, String, String) {
        match self {
            Proof::Record(key, uuid) => (key, format!("@{uuid}"), String::new()),
            Proof::RecordAtLeast(key, uuid, fields, n) => {
                (key, format!("@{uuid}@{fields}"), n.to_string())
            }
        }
    }
}

/// A change waiting for its confirmation.
struct Waiting {
    proof: Proof,
    answer: oneshot::Sender<Result<(), ApiError>>,
}

#[derive(Default)]
struct Lane {
    waiting: Vec<Waiting>,
    /// A round is under way: new changes wait for the next.
    busy: bool,
}

/// The lanes of one store, and the connections their rounds use.
#[derive(Default)]
pub(crate) struct ReplicaAcks {
    lanes: Mutex<HashMap<u32, Lane>>,
    conn: OnceCell<Conn>,
}

impl Store {
    /// Answers once `--min-replicas-ack` replicas hold the change `proof` shows, made in
    /// `shard`; at once when none are asked for. 503 `replicas_unconfirmed` (stored:
    /// unknown) when they do not confirm within [`REPLICA_WAIT_MS`] or the change is not
    /// on the shard's master any more (a failover lost it).
    pub(crate) async fn confirm_replicas(&self, shard: u32, proof: Proof) -> Result<(), ApiError> {
        if self.min_replicas_ack == 0 {
            return Ok(());
        }
        let lane = if self.target.is_cluster() { shard } else { 0 };
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut lanes = self.acks.lanes.lock().expect("replica lanes lock");
            let l = lanes.entry(lane).or_default();
            l.waiting.push(Waiting { proof, answer });
            !std::mem::replace(&mut l.busy, true)
        };
        if start {
            let store = self.clone();
            tokio::spawn(async move { store.ack_rounds(lane, shard).await });
        }
        answered.await.unwrap_or_else(|_| {
            Err(ApiError::unconfirmed(
                "the host stopped before the replicas confirmed the change",
            ))
        })
    }

    /// Runs rounds for `lane` until no change waits.
    async fn ack_rounds(&self, lane: u32, shard: u32) {
        loop {
            let round = {
                let mut lanes = self.acks.lanes.lock().expect("replica lanes lock");
                let l = lanes.entry(lane).or_default();
                if l.waiting.is_empty() {
                    l.busy = false;
                    return;
                }
                std::mem::take(&mut l.waiting)
            };
            let answers = self.ack_round(shard, &round).await;
            for (waiting, answer) in round.into_iter().zip(answers) {
                let _ = waiting.answer.send(answer);
            }
        }
    }

    /// One probe and `WAIT` for `round`, on the lane's own connection.
    async fn ack_round(&self, shard: u32, round: &[Waiting]) -> Vec<Result<(), ApiError>> {
        let want = self.min_replicas_ack;
        let conn = self
            .acks
            .conn
            .get_or_try_init(|| async {
                let conn = Conn::open(&self.target).await?;
                conn.dedicate(self.shards.iter().map(|k| k.slot() as u16));
                Ok::<_, redis::RedisError>(conn)
            })
            .await;
        let mut conn = match conn {
            Ok(conn) => conn.clone(),
            Err(e) => {
                let e = ApiError::unavailable(&e);
                return round.iter().map(|_| Err(e.clone())).collect();
            }
        };
        let k = self.shard(shard);
        let mut probe = redis::cmd("EVAL");
        probe
            .arg(PROBE.as_str())
            .arg(round.len() + 1)
            .arg(k.ack_mark());
        for w in round {
            probe.arg(w.proof.args().0);
        }
        for w in round {
            let (_, field, at_least) = w.proof.args();
            probe.arg(field).arg(at_least);
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(want).arg(REPLICA_WAIT_MS);
        let mut pipe = redis::pipe();
        pipe.add_command(probe).add_command(wait);
        let reply: redis::RedisResult<(Vec<i64>, i64)> = pipe.query_async(&mut conn).await;
        let (found, acked) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                let e = ApiError::unconfirmed(format!(
                    "the change is on the master, but its replicas could not be asked ({e}); look it up before trying again"
                ));
                return round.iter().map(|_| Err(e.clone())).collect();
            }
        };
        found
            .iter()
            .chain(std::iter::repeat(&0))
            .take(round.len())
            .map(|&on_master| {
                if on_master != 1 {
                    Err(ApiError::unconfirmed(
                        "the change is not on the shard's master any more (a failover lost it before a replica had it); look it up before trying again",
                    ))
                } else if acked < want as i64 {
                    Err(ApiError::unconfirmed(format!(
                        "the change is on the master, but only {acked} of the {want} replicas asked for confirmed it within {REPLICA_WAIT_MS} ms; look it up before trying again, or try again with the same id"
                    )))
                } else {
                    Ok(())
                }
            })
            .collect()
    }
}
