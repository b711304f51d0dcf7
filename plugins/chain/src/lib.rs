//! `chain`: runs every N seconds, K times, by booking its own next run.
//!
//! Input: `{"every_seconds": 5, "times": 3, "notify_url"?: "https://...", "step"?: 1}`.
//! Each run posts `{"life_id", "step", "times"}` to `notify_url` when one is given, then,
//! unless this was step `times`, books a point Life that runs this plugin again
//! `every_seconds` after this run was due, with `step + 1`. Output: `{"step": 1,
//! "next_life_id": "..."}` (`null` after the last step).
//!
//! Each follow-up is a booking like any other, so `every_seconds` must leave at least the
//! host's `execution_guard_time` (30 s by default) between steps; a shorter one is
//! refused with `too_soon` and fails the run.
//!
//! The chain lives in the bookings themselves: each step is an ordinary Life that can be
//! listed, shown and cancelled, and a host crash between steps loses nothing.

use kairos_guest::{export_action, http, info, now_ms, schedule, Context, Error};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize)]
struct Input {
    every_seconds: u64,
    times: u32,
    #[serde(default)]
    notify_url: Option<String>,
    #[serde(default = "first")]
    step: u32,
}

fn first() -> u32 {
    1
}

#[derive(Serialize)]
struct Output {
    step: u32,
    next_life_id: Option<String>,
}

fn run(ctx: Context, input: Input) -> Result<Output, Error> {
    if input.every_seconds == 0 || input.times == 0 {
        return Err(Error::fatal("every_seconds and times must be at least 1"));
    }
    if let Some(url) = &input.notify_url {
        let response = http::post_json(
            url,
            &json!({"life_id": ctx.life_id, "step": input.step, "times": input.times}),
        )?;
        if !response.is_success() {
            return Err(Error::retryable(format!(
                "{url} answered {}",
                response.status
            )));
        }
    }
    let next_life_id = if input.step < input.times {
        let every_ms = input.every_seconds.saturating_mul(1000) as i64;
        // Keep the cadence of the booked times; after a late run, count from now.
        let at = (ctx.scheduled_at_ms + every_ms).max(now_ms() + every_ms);
        let id = schedule::book_point(
            at,
            json!({
                "plugin": ctx.plugin_name,
                "input": {
                    "every_seconds": input.every_seconds,
                    "times": input.times,
                    "notify_url": input.notify_url,
                    "step": input.step + 1,
                },
            }),
        )?;
        info!("step {} of {}: booked {id}", input.step, input.times);
        Some(id)
    } else {
        info!(
            "step {} of {}: the chain is complete",
            input.step, input.times
        );
        None
    };
    Ok(Output {
        step: input.step,
        next_life_id,
    })
}

export_action!(run);
