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
    loop {
        tokio::select! {
            biased;
            Some(()) = calls.next(), if !calls.is_empty() => {}
            // While IN_FLIGHT calls are under way, the bookings that come gather here.
            first = rx.recv(), if calls.len() < IN_FLIGHT => {
                let Some(first) = first else { break };
                let mut jobs = vec![first];
                while jobs.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                calls.push(call(conn.clone(), script.clone(), jobs));
            }
        }
    }
    while calls.next().await.is_some() {}
}

/// One call of `book.lua` for `jobs`, each answered with its own reply.
async fn call(mut conn: Conn, script: Arc<Script>, jobs: Vec<Job>) {
    let mut invocation = script.prepare_invoke();
    invocation.key(&jobs[0].booking.due_key).arg("");
    for job in &jobs {
        for arg in &job.booking.args {
            invocation.arg(arg);
        }
    }
    match invocation.invoke_async::<Vec<String>>(&mut conn).await {
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
