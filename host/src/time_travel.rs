//! Moving a manual clock ahead (`kairos serve --clock manual`, `POST /clock`): every
//! Plan due up to the new time fires in order, as if that time had passed. The clock
//! steps from one pending fire time to the next, and at each waits until what is due
//! has run and been recorded, so that a timer's next slot, a retry or a callback booked
//! by a run fires in its turn too (Temporal's time-skipping test server does the same).

use std::time::{Duration, Instant};

use crate::clock::{Clock, ManualClock};
use crate::engine::Engine;
use crate::error::ApiError;

/// Most steps one move takes (one per distinct fire time).
const MAX_STEPS: usize = 100_000;
/// Longest one move runs, in wall time.
const MAX_WALL: Duration = Duration::from_secs(120);
/// Longest wait at one step for what is due to be recorded.
const STEP_PATIENCE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(2);
/// How often this host's own work is looked at while a step settles (memory only).
const LOCAL_POLL: Duration = Duration::from_micros(500);

/// What a move did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// The time the clock shows after it.
    pub now_ms: i64,
    /// Fire times it stopped at.
    pub steps: usize,
    /// Steps whose Plans were still unfinished after `STEP_PATIENCE` (a run that hangs,
    /// a resource that waits): the clock went on without them.
    pub stalled: usize,
    /// False when `MAX_STEPS` or `MAX_WALL` cut the move short of `to_ms`.
    pub complete: bool,
}

impl Engine {
    /// Moves `clock` ahead to `to_ms` (a time behind it leaves it where it is), stopping at
    /// every pending fire time on the way.
    pub async fn move_clock(&self, clock: &ManualClock, to_ms: i64) -> Result<Moved, ApiError> {
        let began = Instant::now();
        let mut moved = Moved::default();
        while moved.steps < MAX_STEPS && began.elapsed() < MAX_WALL {
            let (on_time, firsts) = self.settle(clock.now_ms()).await?;
            if !on_time {
                moved.stalled += 1;
            }
            match firsts.iter().map(|&(_, at)| at).min() {
                Some(next) if next <= to_ms => {
                    clock.move_to(next);
                    // Only the shards with something due at this step are claimed from:
                    // the others' Plans have steps of their own.
                    self.clock_moved_for(
                        firsts
                            .iter()
                            .filter(|&&(_, at)| at <= next)
                            .map(|&(shard, _)| shard),
                    );
                    moved.steps += 1;
                }
                _ => {
                    moved.now_ms = clock.move_to(to_ms);
                    self.clock_moved();
                    if !self.settle(moved.now_ms).await?.0 {
                        moved.stalled += 1;
                    }
                    moved.complete = true;
                    return Ok(moved);
                }
            }
        }
        moved.now_ms = clock.now_ms();
        Ok(moved)
    }

    /// Waits until nothing due by `now_ms` is left unfinished: whether it came within
    /// `STEP_PATIENCE`, and then the first pending fire time of each shard that has one
    /// after `now_ms` (the next steps). This host's own work is watched in memory, and
    /// Redis (every shard, for other hosts' work and what runs booked) asked only once
    /// that is done.
    async fn settle(&self, now_ms: i64) -> Result<(bool, Vec<(u32, i64)>), ApiError> {
        let deadline = Instant::now() + STEP_PATIENCE;
        loop {
            let late = Instant::now() >= deadline;
            if self.busy_by(now_ms) && !late {
                tokio::time::sleep(LOCAL_POLL).await;
                continue;
            }
            let firsts = self
                .store
                .earliest_pending_by_shard(if late { Some(now_ms) } else { None })
                .await
                .map_err(ApiError::from)?;
            if late {
                return Ok((false, firsts));
            }
            if firsts.iter().all(|&(_, at)| at > now_ms) {
                return Ok((true, firsts));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
