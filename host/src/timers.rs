//! Recurring timers (SPEC section 5): the `/timers` routes, and how a finished timer run
//! is recorded and its next slot chosen.
//!
//! A timer is a definition (`timer:{name}`) and one Plan (`plan:{name}:timer`) that goes
//! through the same `due` set, claims, leases and `start_run` fence as a Life's Plans.
//! **Architecture invariant:** a timer has exactly one Plan and its next slot is scheduled
//! only when the run before it has been recorded, so a timer never runs twice at once on
//! any number of hosts. Slots that pass meanwhile, because the run was still going or
//! because no host was up, are not run late one by one: they are logged in the timer's
//! runs list as `skipped`, and the timer runs once and goes on with the next slot.
//! Schedules and the DST rule are in `schedule.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{body_bytes, App};
use crate::error::ApiError;
use crate::executor::DEFAULT_TIMER_RETRIES;
use crate::model::{Action, RunOpts};
use crate::schedule::Schedule;
use crate::scheduler::Engine;
use crate::store::{self, FinishedRun, NextRun, Owner, RunOutcome, TimerFinish, TimerPut};

type Shared = Arc<App>;

/// Fire times shown by `GET /timers/{name}` unless `?preview=` says otherwise.
const DEFAULT_PREVIEW: usize = 5;
/// Skipped slots counted one by one in a skip record; past this it says "at least".
const MAX_SKIPS_COUNTED: usize = 100_000;
/// Default priority of a timer (1 high .. 4 low).
const DEFAULT_PRIORITY: u8 = 2;

/// The `/timers` routes.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/timers", get(list_timers).post(create_timer))
        .route(
            "/timers/{name}",
            get(show_timer).patch(patch_timer).delete(delete_timer),
        )
        .route("/timers/{name}/run", post(run_timer))
        .route("/timers/{name}/activate", post(activate_timer))
        .route("/timers/{name}/deactivate", post(deactivate_timer))
        .route("/timers/{name}/runs", get(timer_runs))
}

/// Names of timers, queues and tasks: they are part of Redis keys.
pub fn check_name(what: &str, name: &str, max_len: usize) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= max_len
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_name",
            format!("{what} `{name}` must be 1 to {max_len} letters, digits, `-` or `_`"),
        ))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerBody {
    name: Option<String>,
    schedule: Option<String>,
    timezone: Option<String>,
    action: Option<Value>,
    priority: Option<u8>,
    timeout: Option<Value>,
    retries: Option<u32>,
    active: Option<bool>,
    next_run: Option<String>,
}

/// A timer's definition as stored.
#[derive(Debug, Clone)]
struct TimerDef {
    schedule_text: String,
    schedule: Schedule,
    timezone: Tz,
    action: Action,
    priority: u8,
    timeout_ms: Option<u64>,
    retries: u32,
    active: bool,
}

impl TimerDef {
    fn from_hash(name: &str, h: &HashMap<String, String>) -> Result<TimerDef, ApiError> {
        let broken =
            |what: &str| ApiError::unavailable(format!("timer `{name}`: stored {what} unreadable"));
        let schedule_text = h
            .get("schedule")
            .cloned()
            .ok_or_else(|| broken("schedule"))?;
        Ok(TimerDef {
            schedule: Schedule::parse(&schedule_text).map_err(|_| broken("schedule"))?,
            schedule_text,
            timezone: h
                .get("timezone")
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| broken("timezone"))?,
            action: h
                .get("action")
                .and_then(|a| serde_json::from_str(a).ok())
                .ok_or_else(|| broken("action"))?,
            priority: h
                .get("priority")
                .and_then(|p| p.parse().ok())
                .unwrap_or(DEFAULT_PRIORITY),
            timeout_ms: h.get("timeout_ms").and_then(|t| t.parse().ok()),
            retries: h
                .get("retries")
                .and_then(|r| r.parse().ok())
                .unwrap_or(DEFAULT_TIMER_RETRIES),
            active: h.get("active").map(String::as_str) == Some("1"),
        })
    }

    fn fields(&self) -> Vec<(String, String)> {
        let mut f = vec![
            ("schedule".to_string(), self.schedule_text.clone()),
            ("timezone".to_string(), self.timezone.name().to_string()),
            ("action".to_string(), self.action_json()),
            ("priority".to_string(), self.priority.to_string()),
            ("retries".to_string(), self.retries.to_string()),
            (
                "active".to_string(),
                if self.active { "1" } else { "0" }.to_string(),
            ),
        ];
        if let Some(t) = self.timeout_ms {
            f.push(("timeout_ms".to_string(), t.to_string()));
        }
        f
    }

    fn action_json(&self) -> String {
        serde_json::to_string(&self.action).expect("actions serialize")
    }

    fn opts_json(&self) -> String {
        serde_json::to_string(&RunOpts {
            priority: Some(self.priority),
            retries: Some(self.retries),
            timeout_ms: self.timeout_ms,
        })
        .expect("opts serialize")
    }

    fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.schedule.next_after(after_ms, self.timezone)
    }
}

fn parse_body(body: &[u8]) -> Result<TimerBody, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request("invalid_body", format!("the timer body does not fit: {e}"))
    })
}

/// Applies the body's fields to `base` (a new timer's defaults, or the stored timer).
async fn apply(
    app: &App,
    body: TimerBody,
    mut def: TimerDef,
    now_ms: i64,
) -> Result<(TimerDef, Option<i64>), ApiError> {
    if let Some(text) = body.schedule {
        def.schedule =
            Schedule::parse(&text).map_err(|e| ApiError::bad_request("invalid_schedule", e))?;
        def.schedule_text = text.trim().to_string();
    }
    if let Some(tz) = body.timezone {
        def.timezone = tz.parse().map_err(|_| {
            ApiError::bad_request(
                "invalid_timezone",
                format!("`{tz}` is not an IANA time zone such as Europe/London"),
            )
        })?;
    }
    if let Some(action) = body.action {
        def.action = app.parse_action("action", &action, now_ms).await?;
    }
    if let Some(p) = body.priority {
        if !(1..=4).contains(&p) {
            return Err(ApiError::bad_request(
                "invalid_priority",
                "priority must be 1 (high) to 4 (low)",
            ));
        }
        def.priority = p;
    }
    if let Some(t) = body.timeout {
        let text = match &t {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_duration",
                    "timeout must be seconds or a string such as \"30s\"",
                ))
            }
        };
        let d = crate::config::parse_duration(&text, std::time::Duration::from_secs(1))
            .map_err(|e| ApiError::bad_request("invalid_duration", format!("timeout: {e}")))?;
        if d.is_zero() || d.as_secs() > 86_400 {
            return Err(ApiError::bad_request(
                "invalid_duration",
                "timeout must be more than 0 and at most a day",
            ));
        }
        def.timeout_ms = Some(d.as_millis() as u64);
    }
    if let Some(r) = body.retries {
        if r > 100 {
            return Err(ApiError::bad_request(
                "invalid_retries",
                "retries must be at most 100",
            ));
        }
        def.retries = r;
    }
    if let Some(a) = body.active {
        def.active = a;
    }
    let next_run = body
        .next_run
        .map(|t| {
            crate::booking::parse_time(&t, app.config.timezone)
                .map(|t| t.timestamp_millis())
                .map_err(|e| ApiError::bad_request("invalid_time", format!("next_run: {e}")))
        })
        .transpose()?;
    Ok((def, next_run))
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("no timer `{name}`"))
}

async fn create_timer(
    State(app): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let body = parse_body(&body)?;
    let name = body
        .name
        .clone()
        .ok_or_else(|| ApiError::bad_request("missing_field", "name is required"))?;
    check_name("timer name", &name, 100)?;
    if body.schedule.is_none() {
        return Err(ApiError::bad_request(
            "missing_field",
            "schedule is required",
        ));
    }
    let Some(action) = body.action.clone() else {
        return Err(ApiError::bad_request("missing_field", "action is required"));
    };
    let now_ms = app.clock.now_ms();
    let base = TimerDef {
        schedule_text: String::new(),
        schedule: Schedule::TimesOfDay(Vec::new()),
        timezone: app.config.timezone,
        action: app.parse_action("action", &action, now_ms).await?,
        priority: DEFAULT_PRIORITY,
        timeout_ms: None,
        retries: DEFAULT_TIMER_RETRIES,
        active: true,
    };
    let (def, next_run) = apply(&app, body, base, now_ms).await?;
    let next = match (def.active, next_run) {
        (false, _) => NextRun::Nothing,
        (true, Some(ms)) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
        (true, None) => match def.next_after(now_ms) {
            Some(ms) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
            None => NextRun::Nothing,
        },
    };
    let mut fields = def.fields();
    fields.push((
        "created_at".into(),
        store::rfc3339(now_ms, app.config.timezone),
    ));
    match app
        .store
        .timer_put(
            &name,
            true,
            "",
            &next,
            false,
            &def.action_json(),
            &def.opts_json(),
            now_ms,
            app.notify_before_ms(now_ms),
            &fields,
        )
        .await?
    {
        TimerPut::Ok(_) => {}
        TimerPut::Duplicate => {
            return Err(ApiError::conflict(
                "duplicate_timer",
                format!("a timer named `{name}` exists; PATCH it or DELETE it first"),
            ))
        }
        other => {
            return Err(ApiError::unavailable(format!(
                "unexpected reply from timer_put: {other:?}"
            )))
        }
    }
    tracing::info!(timer = %name, schedule = %def.schedule_text, "timer created");
    view(&app, &name, DEFAULT_PREVIEW).await
}

/// Changes a timer with optimistic concurrency on its `version`. `change` edits the body
/// given, `activate` is Some for the activate/deactivate routes.
async fn update(app: &App, name: &str, body: TimerBody) -> Result<Json<Value>, ApiError> {
    check_name("timer name", name, 100)?;
    if body.name.as_deref().is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(
            "invalid_body",
            "a timer's name cannot change",
        ));
    }
    for _ in 0..5 {
        let Some((hash, _plan)) = app.store.timer_load(name).await? else {
            return Err(not_found(name));
        };
        let version = hash.get("version").cloned().unwrap_or_else(|| "0".into());
        let current = TimerDef::from_hash(name, &hash)?;
        let now_ms = app.clock.now_ms();
        let body = TimerBody {
            name: None,
            schedule: body.schedule.clone(),
            timezone: body.timezone.clone(),
            action: body.action.clone(),
            priority: body.priority,
            timeout: body.timeout.clone(),
            retries: body.retries,
            active: body.active,
            next_run: body.next_run.clone(),
        };
        let (def, next_run) = apply(app, body, current.clone(), now_ms).await?;
        let moved = def.schedule_text != current.schedule_text
            || def.timezone != current.timezone
            || (def.active && !current.active);
        let next = match (def.active, next_run) {
            (false, _) => NextRun::Nothing,
            (true, Some(ms)) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
            (true, None) if moved => match def.next_after(now_ms) {
                Some(ms) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
                None => NextRun::Nothing,
            },
            (true, None) => NextRun::Keep,
        };
        match app
            .store
            .timer_put(
                name,
                false,
                &version,
                &next,
                next_run.is_some(),
                &def.action_json(),
                &def.opts_json(),
                now_ms,
                app.notify_before_ms(now_ms),
                &def.fields(),
            )
            .await?
        {
            TimerPut::Ok(_) => return view(app, name, DEFAULT_PREVIEW).await,
            TimerPut::Missing => return Err(not_found(name)),
            _ => continue,
        }
    }
    Err(ApiError::conflict(
        "concurrent_change",
        "the timer kept changing while this change was applied; try again",
    ))
}

fn empty_body() -> TimerBody {
    TimerBody {
        name: None,
        schedule: None,
        timezone: None,
        action: None,
        priority: None,
        timeout: None,
        retries: None,
        active: None,
        next_run: None,
    }
}

async fn patch_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    update(&app, &name, parse_body(&body)?).await
}

async fn set_active(app: &App, name: &str, active: bool) -> Result<Json<Value>, ApiError> {
    let body = TimerBody {
        active: Some(active),
        ..empty_body()
    };
    update(app, name, body).await
}

async fn activate_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_active(&app, &name, true).await
}

async fn deactivate_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_active(&app, &name, false).await
}

async fn run_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    let now_ms = app.clock.now_ms();
    let reply = app
        .store
        .timer_run_now(&name, now_ms, app.notify_before_ms(now_ms))
        .await?;
    match reply.as_str() {
        "ok" => Ok(Json(json!({
            "name": name,
            "run_at": store::rfc3339(now_ms, app.config.timezone),
            "run_at_ms": now_ms,
        }))),
        "running" => Err(ApiError::conflict(
            "timer_running",
            format!("timer `{name}` is running now; a timer never runs twice at once, try again when it returns"),
        )),
        _ => Err(not_found(&name)),
    }
}

async fn delete_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    if app.store.timer_delete(&name).await? {
        Ok(Json(json!({"name": name, "deleted": true})))
    } else {
        Err(not_found(&name))
    }
}

async fn show_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let preview =
        match query.get("preview") {
            None => DEFAULT_PREVIEW,
            Some(n) => n.parse().ok().filter(|n| *n <= 100).ok_or_else(|| {
                ApiError::bad_request("invalid_query", "preview must be 0 to 100")
            })?,
        };
    view(&app, &name, preview).await
}

async fn list_timers(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    let now_ms = app.clock.now_ms();
    let items: Vec<Value> = app
        .store
        .timer_list()
        .await?
        .into_iter()
        .map(|(name, hash, plan)| timer_json(&app, &name, &hash, &plan, now_ms, 0))
        .collect();
    Ok(Json(json!({"items": items})))
}

async fn timer_runs(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    let limit = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(50usize)
        .clamp(1, store::TIMER_RUNS_KEPT);
    if app.store.timer_load(&name).await?.is_none() {
        return Err(not_found(&name));
    }
    let tz = app.config.timezone;
    let items: Vec<Value> = app
        .store
        .timer_runs(&name, limit)
        .await?
        .into_iter()
        .map(|mut r| {
            for (ms_field, text_field) in [
                ("should_run_at", "should_run_at_time"),
                ("started_at", "started_at_time"),
            ] {
                if let Some(ms) = r.get(ms_field).and_then(Value::as_i64) {
                    r[text_field] = Value::String(store::rfc3339(ms, tz));
                }
            }
            r
        })
        .collect();
    Ok(Json(json!({"name": name, "items": items})))
}

async fn view(app: &App, name: &str, preview: usize) -> Result<Json<Value>, ApiError> {
    check_name("timer name", name, 100)?;
    let Some((hash, plan)) = app.store.timer_load(name).await? else {
        return Err(not_found(name));
    };
    Ok(Json(timer_json(
        app,
        name,
        &hash,
        &plan,
        app.clock.now_ms(),
        preview,
    )))
}

fn timer_json(
    app: &App,
    name: &str,
    hash: &HashMap<String, String>,
    plan: &HashMap<String, String>,
    now_ms: i64,
    preview: usize,
) -> Value {
    let text = |k: &str| {
        hash.get(k)
            .cloned()
            .map(Value::String)
            .unwrap_or(Value::Null)
    };
    let num = |k: &str| {
        hash.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    let mut out = json!({
        "name": name,
        "schedule": text("schedule"),
        "timezone": text("timezone"),
        "action": hash.get("action").and_then(|a| serde_json::from_str::<Value>(a).ok()),
        "priority": num("priority"),
        "timeout_ms": num("timeout_ms"),
        "retries": num("retries"),
        "active": hash.get("active").map(String::as_str) == Some("1"),
        "state": plan.get("state").cloned().unwrap_or_else(|| "Inactive".into()),
        "next_run": text("next_run"),
        "next_run_ms": num("next_run_ms"),
        "last_run_at_ms": num("last_run_at_ms"),
        "last_outcome": text("last_outcome"),
        "created_at": text("created_at"),
        "version": num("version"),
    });
    if preview > 0 {
        if let Ok(def) = TimerDef::from_hash(name, hash) {
            let times = if def.active {
                def.schedule.preview(now_ms, def.timezone, preview)
            } else {
                Vec::new()
            };
            out["preview"] = times
                .iter()
                .map(|ms| Value::String(store::rfc3339(*ms, def.timezone)))
                .collect();
            out["preview_ms"] = times.into_iter().map(Value::from).collect();
        }
    }
    let _ = app;
    out
}

impl Engine {
    /// Records one finished timer run and schedules its next slot (or its retry).
    pub(crate) async fn record_timer(&self, run: FinishedRun) {
        let Some(Owner::Timer(name)) = run.plan.owner() else {
            return;
        };
        let name = name.to_string();
        for _ in 0..5 {
            let loaded = self
                .retry_store("timer", || self.store.timer_for_finish(&name))
                .await;
            let Some(loaded) = loaded else { return };
            let now_ms = self.clock.now_ms();
            let record = store::run_record_json(&self.host_id, "timer", &run.record);
            let (version, next, skips, outcome) = match loaded {
                None => (String::new(), None, Vec::new(), "done"),
                Some((schedule, timezone, version, slot_ms)) => {
                    let tz: Tz = timezone.parse().unwrap_or(chrono_tz::UTC);
                    let schedule = Schedule::parse(&schedule).ok();
                    match (run.outcome.clone(), schedule) {
                        (RunOutcome::Retry { next_ms }, _) => (
                            version,
                            Some((next_ms, store::rfc3339(next_ms, tz))),
                            Vec::new(),
                            "retry",
                        ),
                        (outcome, Some(schedule)) => {
                            let slot_ms = slot_ms.unwrap_or(run.record.should_run_at_ms);
                            // After retries, the slot's run began before this attempt:
                            // every slot since it came while that run was still going.
                            let run_began_ms = if run.record.attempt > 1 {
                                slot_ms
                            } else {
                                run.record.started_at_ms
                            };
                            let skips = self.skip_records(
                                &name,
                                &schedule,
                                tz,
                                slot_ms,
                                run_began_ms,
                                now_ms,
                            );
                            let next = schedule
                                .next_after(now_ms, tz)
                                .map(|ms| (ms, store::rfc3339(ms, tz)));
                            let word = if outcome == RunOutcome::Done {
                                "done"
                            } else {
                                "failed"
                            };
                            (version, next, skips, word)
                        }
                        (_, None) => (version, None, Vec::new(), "failed"),
                    }
                }
            };
            let finish = TimerFinish {
                name: &name,
                claim: &run.plan.claim,
                outcome,
                next,
                version: &version,
                record: record.to_string(),
                skips,
            };
            let notify_before = self.notify_before_ms();
            let reply = self
                .retry_store("timer", || {
                    self.store
                        .finish_timer(&self.host_id, &finish, now_ms, notify_before)
                })
                .await;
            match reply.as_deref() {
                Some("changed") => continue,
                Some("lost") => {
                    tracing::warn!(timer = %name, "the timer's Plan was taken over while it ran; its run is recorded, its schedule left to the new holder");
                    return;
                }
                _ => return,
            }
        }
    }

    /// Skip records for the slots in `(slot_ms, now_ms]`: those before the run began were
    /// missed (no host ran the timer then), those after came while it was running.
    fn skip_records(
        &self,
        name: &str,
        schedule: &Schedule,
        tz: Tz,
        slot_ms: i64,
        run_began_ms: i64,
        now_ms: i64,
    ) -> Vec<String> {
        let (slots, more) = schedule.between(slot_ms, now_ms, tz, MAX_SKIPS_COUNTED);
        let (missed, overlapped): (Vec<i64>, Vec<i64>) =
            slots.into_iter().partition(|s| *s < run_began_ms);
        let mut out = Vec::new();
        for (slots, reason) in [
            (
                missed,
                "missed: no host ran the timer at these times (down or busy); it ran once for them",
            ),
            (
                overlapped,
                "the previous run was still going; a timer never runs twice at once",
            ),
        ] {
            let (Some(first), Some(last)) = (slots.first(), slots.last()) else {
                continue;
            };
            tracing::info!(timer = %name, skipped = slots.len(), first_ms = first, reason, "timer slots skipped");
            out.push(
                json!({
                    "plan": "timer",
                    "outcome": "skipped",
                    "should_run_at": first,
                    "last_should_run_at": last,
                    "skipped": slots.len(),
                    "more": more,
                    "host": self.host_id,
                    "reason": reason,
                    "started_at": now_ms,
                    "duration_ms": 0,
                })
                .to_string(),
            );
        }
        out
    }
}
