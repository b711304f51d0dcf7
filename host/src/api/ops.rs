//! What operators and probes read: `/metrics`, `/healthz`, `/readyz`, and the 404 of
//! unknown routes.

use crate::error::ApiError;
use axum::extract::State;
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::views::Health;
use super::Shared;
use crate::error::ErrorBody;

/// `/metrics` alone, without a token, for `--metrics-listen`: scrapers on an internal
/// address need no API token, and the API need not be reachable from them.
pub fn metrics_router(app: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app)
}

/// Prometheus text format: this host's counters, its claimed and running Plans, and the
/// cluster's due Plans and live hosts read from Redis.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format.", body = String, content_type = "text/plain"))
)]
pub(crate) async fn metrics(State(app): State<Shared>) -> Result<Response, ApiError> {
    let stats = app.store.cluster_stats(app.clock.now_ms()).await?;
    let memory = app.store.memory();
    let (used, max, _) = memory.fullest();
    let mut text = app.engine.metrics.render(&[
        (
            "kairos_claimed_plans",
            "Plans this host holds in memory (timer, queue, running).",
            app.engine.claimed() as f64,
        ),
        (
            "kairos_running_plans",
            "Actions running on this host now.",
            app.engine.running() as f64,
        ),
        (
            "kairos_shards_owned",
            "Shards of the keyspace this host works now.",
            app.engine.shards.len() as f64,
        ),
        (
            "kairos_lease_remaining_seconds",
            "How long this host's lease on its shards holds without another renewal (negative: lapsed).",
            app.engine.lease_left_ms() as f64 / 1000.0,
        ),
        (
            "kairos_due_plans",
            "Plans waiting in Redis to be claimed (all hosts).",
            stats.due as f64,
        ),
        (
            "kairos_hosts_alive",
            "Hosts whose lease is current (all hosts).",
            stats.hosts as f64,
        ),
        (
            "kairos_history_lives",
            "Finished Lives kept as history (all hosts).",
            stats.finished as f64,
        ),
        (
            "kairos_redis_used_memory_bytes",
            "used_memory of the fullest shard's Redis at the last look (every second).",
            used as f64,
        ),
        (
            "kairos_redis_maxmemory_bytes",
            "maxmemory of that Redis (0: no limit).",
            max as f64,
        ),
        (
            "kairos_overdue_plans",
            "Plans of Lives and timers past their fire time and not yet claimed (all hosts): a backlog.",
            stats.overdue as f64,
        ),
        (
            "kairos_overdue_tasks",
            "Queue tasks that may run now and still wait (all hosts).",
            stats.overdue_tasks as f64,
        ),
        (
            "kairos_oldest_overdue_plan_age_seconds",
            "How long the oldest overdue Plan has waited (0: none).",
            stats.oldest_overdue_ms.max(0) as f64 / 1000.0,
        ),
        (
            "kairos_failed_runs_last_hour",
            "Runs that failed for good (no retry left, or not retryable) in the last hour, all hosts.",
            stats.failed_last_hour as f64,
        ),
    ], &[
        (
            "kairos_bookings_refused_storage_full_total",
            "Bookings this host answered 507 because Redis was nearly full.",
            memory.refused.load(std::sync::atomic::Ordering::Relaxed),
        ),
        (
            "kairos_history_shed_lives_total",
            "Finished Lives this host deleted before their retention because Redis was nearly full.",
            memory.shed.load(std::sync::atomic::Ordering::Relaxed),
        ),
    ]);
    text.push_str(&memory.info_metric());
    text.push_str(
        "# HELP kairos_lives Lives by state, all hosts (finished ones while history keeps them).\n# TYPE kairos_lives gauge\n",
    );
    for (state, n) in crate::store::LIFE_STATES.iter().zip(stats.lives) {
        text.push_str(&format!("kairos_lives{{state=\"{state}\"}} {n}\n"));
    }
    text.push_str(&queue_and_timer_series(&app).await?);
    text.push_str(&format!(
        "# HELP kairos_build_info The kairos build this host runs.\n# TYPE kairos_build_info gauge\nkairos_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    ));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// Liveness: fails (503) when this host has not renewed its lease for three lease
/// periods, i.e. it cannot reach Redis and so cannot work, so that a supervisor restarts
/// it.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "Alive.", body = Health, example = json!({"status": "ok"})),
        (status = 503, description = "The host has not renewed its lease for three lease periods: it cannot reach Redis.", body = ErrorBody),
    )
)]
pub(crate) async fn healthz(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    let stale_ms = app.engine.ms_since_lease_renewed();
    let limit_ms = 3 * app.config.lease_ttl.as_millis() as i64;
    if stale_ms > limit_ms {
        return Err(ApiError::unavailable(format!(
            "this host has not renewed its lease for {stale_ms} ms: it cannot reach Redis"
        )));
    }
    Ok(Json(json!({"status": "ok"})))
}

/// Readiness: Redis answers PING within a second.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "Redis answers.", body = Health, example = json!({"status": "ready", "host_id": "host-a"})),
        (status = 503, description = "Redis did not answer PING within a second.", body = ErrorBody),
    )
)]
pub(crate) async fn readyz(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    match tokio::time::timeout(std::time::Duration::from_secs(1), app.store.ping()).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(ApiError::unavailable(
                "Redis did not answer PING within 1 s",
            ))
        }
    }
    Ok(Json(
        json!({"status": "ready", "host_id": app.config.host_id}),
    ))
}

/// `GET /clock`: the time the engine goes by, and whether it is manual.
#[utoipa::path(
    get,
    path = "/clock",
    tag = "operations",
    responses((status = 200, description = "The engine's time and the clock's mode.", body = super::views::ClockView))
)]
pub(crate) async fn show_clock(State(app): State<Shared>) -> Json<Value> {
    let now_ms = app.clock.now_ms();
    Json(json!({
        "now": crate::store::rfc3339(now_ms, app.config.timezone),
        "now_ms": now_ms,
        "mode": if app.manual_clock.is_some() { "manual" } else { "system" },
    }))
}

/// `POST /clock`'s body: one of the two.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClockBody {
    /// How far to move the clock ahead: seconds, or a string such as `"90m"` or `"7d"`.
    #[schema(value_type = Option<String>, example = "7d")]
    advance: Option<Value>,
    /// The time to move it to (RFC 3339, or `YYYY-MM-DD HH:MM:SS` in the host's zone); not
    /// before the clock's time.
    set: Option<String>,
}

/// Furthest one `POST /clock` moves the clock (ten years).
const MAX_CLOCK_MOVE_MS: i64 = 3650 * 86_400_000;

/// `POST /clock {"advance": "90m"}` or `{"set": TIME}` (admin scope, `--clock manual`
/// only): moves the clock ahead, every Plan due on the way firing in order
/// (`time_travel.rs`), and answers when they have run.
#[utoipa::path(
    post,
    path = "/clock",
    tag = "operations",
    request_body = ClockBody,
    responses(
        (status = 200, description = "Moved; every Plan due on the way has run.", body = super::views::ClockMoved),
        (status = 400, description = "Neither or both of advance and set, a time behind the clock, more than ten years (`invalid_clock`), a bad duration (`invalid_duration`).", body = ErrorBody),
        (status = 409, description = "The host runs on the system clock (`clock_not_manual`).", body = ErrorBody),
    )
)]
pub(crate) async fn move_clock(
    State(app): State<Shared>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = super::body_bytes(body, app.config.max_body_bytes)?;
    let Some(clock) = app.manual_clock.clone() else {
        return Err(ApiError::conflict(
            "clock_not_manual",
            "this host runs on the system clock; start it with --clock manual to move time",
        ));
    };
    let body: ClockBody = crate::queues::parse_json(&body)?;
    let now_ms = app.clock.now_ms();
    let bad = |message: String| ApiError::bad_request("invalid_clock", message);
    let to_ms = match (&body.advance, &body.set) {
        (Some(by), None) => {
            let by = crate::bookings::request::parse_duration_value("advance", by)?;
            let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
            if by > MAX_CLOCK_MOVE_MS {
                return Err(bad("advance must be at most ten years".into()));
            }
            now_ms + by
        }
        (None, Some(text)) => {
            let at = crate::bookings::request::parse_time(text, app.config.timezone)
                .map_err(|e| bad(format!("set: {e}")))?
                .timestamp_millis();
            if at < now_ms {
                return Err(bad(format!(
                    "set: the clock only moves ahead; `{text}` is before its time, {}",
                    crate::store::rfc3339(now_ms, app.config.timezone)
                )));
            }
            if at - now_ms > MAX_CLOCK_MOVE_MS {
                return Err(bad("set must be at most ten years ahead".into()));
            }
            at
        }
        _ => {
            return Err(bad(
                "give one of advance (a duration) and set (a time)".into()
            ))
        }
    };
    let moved = app.engine.move_clock(&clock, to_ms).await?;
    tracing::info!(
        now_ms = moved.now_ms,
        steps = moved.steps,
        stalled = moved.stalled,
        "clock moved"
    );
    Ok(Json(json!({
        "now": crate::store::rfc3339(moved.now_ms, app.config.timezone),
        "now_ms": moved.now_ms,
        "steps": moved.steps,
        "stalled": moved.stalled,
        "complete": moved.complete,
    })))
}

pub(crate) async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

/// Most queues and timers given series of their own in `/metrics` (by name), so that a
/// scrape stays cheap with many of them.
const PER_OBJECT_SERIES_MAX: usize = 500;

use crate::metrics::label_value as label;

/// How many of a timer's newest runs are read for its last lateness.
const RUNS_FOR_LATENESS: usize = 5;

/// Start minus slot of the newest run that started (slots skipped without starting are
/// passed over), in ms, never below 0.
fn last_lateness_ms(runs: &[Value]) -> Option<i64> {
    runs.iter()
        .filter(|r| r["outcome"] != "skipped")
        .find_map(|r| Some((r["started_at"].as_i64()? - r["should_run_at"].as_i64()?).max(0)))
}

/// Per-queue task counts and per-timer last outcome, lateness, last run and next run, for the
/// first `PER_OBJECT_SERIES_MAX` queues and timers.
async fn queue_and_timer_series(app: &crate::api::App) -> Result<String, ApiError> {
    use std::fmt::Write;
    let mut out = String::new();
    let names = app.store.queue_names().await?;
    let _ = writeln!(
        out,
        "# HELP kairos_queue_tasks A queue's tasks by state (pending: waiting to run, or in a pull queue to be leased or under lease; running; failed: out of retries; leased: pull tasks under a lease).\n# TYPE kairos_queue_tasks gauge"
    );
    let names = &names[..names.len().min(PER_OBJECT_SERIES_MAX)];
    let now_ms = app.clock.now_ms();
    // One round trip's wait for all of them, not one per queue.
    let all_counts =
        futures_util::future::try_join_all(names.iter().map(|n| app.store.queue_counts(n, now_ms)))
            .await?;
    for (name, counts) in names.iter().zip(all_counts) {
        let q = label(name);
        for (state, n) in [
            ("pending", counts.pending),
            ("running", counts.running),
            ("failed", counts.failed),
            ("leased", counts.leased),
        ] {
            let _ = writeln!(
                out,
                "kairos_queue_tasks{{queue=\"{q}\",state=\"{state}\"}} {n}"
            );
        }
    }
    let (timers, _) = app.store.timer_page(None, PER_OBJECT_SERIES_MAX).await?;
    let timers = &timers[..];
    // Each timer's newest runs (a few: slots skipped after a run are logged after it),
    // all read at once.
    let recent = futures_util::future::try_join_all(
        timers
            .iter()
            .map(|(name, _, _)| app.store.timer_runs(name, RUNS_FOR_LATENESS)),
    )
    .await?;
    let mut outcome = String::from(
        "# HELP kairos_timer_last_outcome The outcome of a timer's last run (1 for the outcome it had).\n# TYPE kairos_timer_last_outcome gauge\n",
    );
    let mut last = String::from(
        "# HELP kairos_timer_last_run_timestamp_seconds When a timer's last run was recorded.\n# TYPE kairos_timer_last_run_timestamp_seconds gauge\n",
    );
    let mut next = String::from(
        "# HELP kairos_timer_next_run_timestamp_seconds When a timer runs next (absent while inactive).\n# TYPE kairos_timer_next_run_timestamp_seconds gauge\n",
    );
    let mut lateness = String::from(
        "# HELP kairos_timer_last_lateness_seconds How late a timer's last run started against its slot (its should-run-at time).\n# TYPE kairos_timer_last_lateness_seconds gauge\n",
    );
    for ((name, timer, plan), runs) in timers.iter().zip(&recent) {
        let t = label(name);
        if let Some(late_ms) = last_lateness_ms(runs) {
            let _ = writeln!(
                lateness,
                "kairos_timer_last_lateness_seconds{{timer=\"{t}\"}} {}",
                late_ms as f64 / 1000.0
            );
        }
        if let Some(o) = timer.get("last_outcome") {
            let _ = writeln!(
                outcome,
                "kairos_timer_last_outcome{{timer=\"{t}\",outcome=\"{}\"}} 1",
                label(crate::timers::last_outcome(o))
            );
        }
        if let Some(ms) = timer
            .get("last_run_at_ms")
            .and_then(|v| v.parse::<i64>().ok())
        {
            let _ = writeln!(
                last,
                "kairos_timer_last_run_timestamp_seconds{{timer=\"{t}\"}} {}",
                ms as f64 / 1000.0
            );
        }
        let active = !matches!(
            plan.get("state").map(String::as_str),
            Some("Inactive") | None
        );
        if let (true, Some(ms)) = (
            active,
            plan.get("fire_at_ms").and_then(|v| v.parse::<i64>().ok()),
        ) {
            let _ = writeln!(
                next,
                "kairos_timer_next_run_timestamp_seconds{{timer=\"{t}\"}} {}",
                ms as f64 / 1000.0
            );
        }
    }
    out.push_str(&outcome);
    out.push_str(&lateness);
    out.push_str(&last);
    out.push_str(&next);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label("x\ny"), "x\\ny");
    }
}
