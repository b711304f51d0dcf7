//! Group commit of bookings: the bookings that reach a host while its calls of `book` are
//! under way go to Redis together, in one call of `scripts/book.lua`.
//!
//! A call of `book` is the unit that Redis and the host pay for once: the call and its
//! round trip, the shard's bucket count read and its census written. Here a booking waits
//! only while [`IN_FLIGHT`] calls are already under way: one alone is sent at once, and
//! under load each call takes up to [`MAX_BATCH`] that came meanwhile. Each booking is
//! judged on its own inside the call, in arrival order, exactly as if it had come alone:
//! its answer (`book_life` in common.lua) comes back to its caller only. (Most of a
//! booking's Redis time is per command, ~1.5–2 µs of Lua bridge each, not per call:
//! this saves ~8 % of it; BENCHMARKS.md, session 20.)
//!
//! On a standalone Redis one call takes bookings of any shards (`enter_shard`), and one
//! [`Booker`] serves the store. On a Redis Cluster each shard has its own, whose calls
//! take that shard's bookings only, as every script does: a master that stalls holds
//! back only its own shards' bookings, as with the connection per slot (store/conn.rs).
//!
//! **Order when Redis lost its scripts.** After a restart (or a `SCRIPT FLUSH`) every call
//! under way finds `book` missing. A call that loaded it and tried again on its own could
//! be overtaken by a later call sent after the load, and the retries of several calls
//! could reach Redis in any order. So a call that finds the script missing gives its
//! bookings back ([`Sent::Missing`]); the batcher sends nothing new until every call under
//! way has answered, loads the script, and sends the calls that found it missing again,
//! one after another in the order they were first sent. One Redis runs one connection's
//! commands in order, so the calls sent after a missing one found it missing too, unless
//! another client loaded it in between (another host, after the same restart): then a
//! later call may still go first, a window of a round trip.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{RedisError, Script};
use tokio::sync::{mpsc, oneshot};

use super::conn::Conn;

/// Calls of `book` under way at once: while they are, bookings gather for the next.
const IN_FLIGHT: usize = 4;

/// Bookings in one call at most: a call holds Redis ~35 µs a booking, and a long one
/// delays every other client of that Redis (fires among them).
const MAX_BATCH: usize = 32;

/// One booking as `book.lua` takes it: its shard's prefix, then its arguments.
pub(super) struct Booking {
    /// The shard's due tree: the key a Redis Cluster routes the call by.
    pub due_key: String,
    pub args: Vec<String>,
}

/// `book_life`'s answer and its detail ('' for none), or the call's error.
pub(super) type Answer = Result<(String, String), RedisError>;

struct Job {
    booking: Booking,
    answer: oneshot::Sender<Answer>,
}

/// The sending side; the task that makes the calls ends when the last clone is dropped.
#[derive(Clone)]
pub(super) struct Booker {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Booker {
    /// Starts the task that makes the calls (in the current Tokio runtime).
    pub fn start(conn: Conn, script: Arc<Script>) -> Booker {
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, conn, script));
        Booker { jobs }
    }

    /// Books, in the next call that has room; answers `book_life`'s reply.
    pub async fn book(&self, booking: Booking) -> Answer {
        let (answer, reply) = oneshot::channel();
        let gone = || RedisError::from((redis::ErrorKind::Client, "the booking task ended"));
        self.jobs
            .send(Job { booking, answer })
            .map_err(|_| gone())?;
        reply.await.map_err(|_| gone())?
    }
}

async fn run(mut rx: mpsc::UnboundedReceiver<Job>, conn: Conn, script: Arc<Script>) {
    // The calls under way, polled by this one task: a call pushed here is first polled,
    // and so sent, after every call pushed before it, so that bookings reach Redis in
    // the order they came (`POST /schedules/batch` answers its items in order).
    let mut calls = FuturesUnordered::new();
    // The calls that found the script missing, by the order they were sent in.
    let mut missing: Vec<(u64, Vec<Job>)> = Vec::new();
    let mut sent: u64 = 0;
    loop {
        if calls.is_empty() && !missing.is_empty() {
            resend_in_order(&conn, &script, &mut missing).await;
        }
        tokio::select! {
            biased;
            Some(reply) = calls.next(), if !calls.is_empty() => {
                if let Sent::Missing(n, jobs) = reply {
                    missing.push((n, jobs));
                }
            }
            // While IN_FLIGHT calls are under way, the bookings that come gather here;
            // while a call waits to be sent again, nothing new goes before it.
            first = rx.recv(), if calls.len() < IN_FLIGHT && missing.is_empty() => {
                let Some(first) = first else { break };
                let mut jobs = vec![first];
                while jobs.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                sent += 1;
                calls.push(call(conn.clone(), script.clone(), sent, jobs));
            }
        }
    }
    while let Some(reply) = calls.next().await {
        if let Sent::Missing(n, jobs) = reply {
            missing.push((n, jobs));
        }
    }
    resend_in_order(&conn, &script, &mut missing).await;
}

/// What became of a call: answered, or given back (its number and bookings) because
/// Redis did not have the script.
enum Sent {
    Answered,
    Missing(u64, Vec<Job>),
}

/// Sends the calls that found the script missing again, one at a time in the order they
/// were first sent, each after loading the script (Redis may lose it again meanwhile).
async fn resend_in_order(conn: &Conn, script: &Script, missing: &mut Vec<(u64, Vec<Job>)>) {
    missing.sort_by_key(|(n, _)| *n);
    for (_, jobs) in missing.drain(..) {
        let mut conn = conn.clone();
        let reply = match script.load_async(&mut conn).await {
            Ok(_) => book_cmd(script, &jobs).query_async(&mut conn).await,
            Err(e) => Err(e),
        };
        answer(jobs, reply);
    }
}

/// `EVALSHA` of `book.lua` for `jobs`: routed by the first booking's due tree, then each
/// booking's arguments.
fn book_cmd(script: &Script, jobs: &[Job]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(1)
        .arg(&jobs[0].booking.due_key)
        .arg("");
    for job in jobs {
        for arg in &job.booking.args {
            cmd.arg(arg);
        }
    }
    cmd
}

/// One call of `book.lua` for `jobs` (the `n`th the batcher sent), each answered with its
/// own reply; given back when Redis does not have the script (never loaded here: see the
/// module's note on order).
async fn call(mut conn: Conn, script: Arc<Script>, n: u64, jobs: Vec<Job>) -> Sent {
    let reply = book_cmd(&script, &jobs)
        .query_async::<Vec<String>>(&mut conn)
        .await;
    if let Err(e) = &reply {
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
            return Sent::Missing(n, jobs);
        }
    }
    answer(jobs, reply);
    Sent::Answered
}

/// Answers each booking of a call with its own part of the reply.
fn answer(jobs: Vec<Job>, reply: Result<Vec<String>, RedisError>) {
    match reply {
        Ok(reply) if reply.len() == 2 * jobs.len() => {
            let mut reply = reply.into_iter();
            for job in jobs {
                let verdict = reply.next().unwrap_or_default();
                let detail = reply.next().unwrap_or_default();
                let _ = job.answer.send(Ok((verdict, detail)));
            }
        }
        Ok(reply) => {
            let e = RedisError::from((
                redis::ErrorKind::Parse,
                "book answered a reply of the wrong length",
                format!("{} values for {} bookings", reply.len(), jobs.len()),
            ));
            for job in jobs {
                let _ = job.answer.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.answer.send(Err(e.clone()));
            }
        }
    }
}
