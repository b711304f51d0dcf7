//! A pull queue's workers: lease due tasks, then ack, extend or nack each (SPEC section 6).

use super::{body_bytes, App, Shared};
use crate::error::ApiError;
use crate::model::check_name;
use crate::store;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::queues::not_found;
use super::views::{LeaseChanged, Leased};
use crate::error::ErrorBody;

use crate::queues::{bad, parse_json, TASK_TOMBSTONE_MS};

/// `POST /queues/{name}/lease` of a pull queue: `{count?, lease_seconds?, tag?}`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseBody {
    /// How many due tasks to lease, 1 to 1000 (default 1).
    #[schema(minimum = 1, maximum = 1000)]
    count: Option<u64>,
    /// The lease's length (default 60 s, at most a week).
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    lease_seconds: Option<Value>,
    /// Lease only tasks of this tag.
    tag: Option<String>,
}

/// `{lease_id, lease_seconds?}` of ack, extend and nack (`lease_seconds`: how long the
/// lease lasts from now (extend), or how long until the task is due again (nack)).
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseAnswer {
    /// The `lease_id` the lease call gave.
    lease_id: String,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    lease_seconds: Option<Value>,
}

/// The most tasks one lease call hands out.
const MAX_LEASE_COUNT: u64 = 1000;
/// A lease's length when none is given.
const DEFAULT_LEASE_MS: i64 = 60_000;
/// The longest lease (a week, as GAE pull queues).
const MAX_LEASE_MS: u64 = 7 * 86_400_000;

fn lease_ms(value: Option<&Value>, default_ms: i64, zero_ok: bool) -> Result<i64, ApiError> {
    let Some(value) = value else {
        return Ok(default_ms);
    };
    let d = crate::bookings::request::parse_duration_value("lease_seconds", value)?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms > MAX_LEASE_MS || (ms == 0 && !zero_ok) {
        return Err(bad(
            "invalid_duration",
            format!(
                "lease_seconds must be {} and at most a week",
                if zero_ok { "0 or more" } else { "more than 0" }
            ),
        ));
    }
    Ok(ms as i64)
}

/// A pull queue's worker leases due tasks.
#[utoipa::path(
    post,
    path = "/queues/{name}/lease",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    request_body(content = LeaseBody, description = "May be empty: one task for 60 s.", example = json!({"count": 10, "lease_seconds": 60})),
    responses(
        (status = 200, description = "The leased tasks (none when none is due).", body = Leased),
        (status = 400, description = "A field that does not parse, or a push queue.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn lease_tasks(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &queue, 100)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let body: LeaseBody = if body.is_empty() {
        LeaseBody {
            count: None,
            lease_seconds: None,
            tag: None,
        }
    } else {
        parse_json(&body)?
    };
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_LEASE_COUNT).contains(&count) {
        return Err(bad(
            "invalid_body",
            format!("count must be 1 to {MAX_LEASE_COUNT}"),
        ));
    }
    let lease = lease_ms(body.lease_seconds.as_ref(), DEFAULT_LEASE_MS, false)?;
    if let Some(tag) = &body.tag {
        check_name("tag", tag, 500)?;
    }
    let now_ms = app.clock.now_ms();
    let leased = app
        .store
        .task_lease(&queue, count as usize, lease, body.tag.as_deref(), now_ms)
        .await?
        .ok_or_else(|| not_found(&queue))?;
    let tz = app.config.timezone;
    let tasks: Vec<Value> = leased
        .into_iter()
        .map(|t| {
            json!({
                "queue": queue,
                "name": t.name,
                "payload": t.payload,
                "tag": t.tag,
                "attempts": t.attempts,
                "eta": store::rfc3339(t.eta_ms, tz),
                "lease_id": t.lease_id,
                "lease_expires_at": store::rfc3339(t.lease_expires_ms, tz),
                "lease_expires_ms": t.lease_expires_ms,
            })
        })
        .collect();
    Ok(Json(json!({"tasks": tasks})))
}

async fn answer_lease(
    app: &App,
    queue: &str,
    task: &str,
    mode: &str,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", queue, 100)?;
    check_name("task name", task, 500)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let answer: LeaseAnswer = parse_json(&body)?;
    let lease = match mode {
        "extend" => lease_ms(answer.lease_seconds.as_ref(), DEFAULT_LEASE_MS, false)?,
        "nack" => lease_ms(answer.lease_seconds.as_ref(), 0, true)?,
        _ if answer.lease_seconds.is_some() => {
            return Err(bad("invalid_body", "an ack takes no lease_seconds"))
        }
        _ => 0,
    };
    let now_ms = app.clock.now_ms();
    let (word, lease_end) = app
        .store
        .task_lease_change(
            queue,
            task,
            mode,
            &answer.lease_id,
            lease,
            now_ms,
            TASK_TOMBSTONE_MS,
        )
        .await?;
    match word.as_str() {
        "ok" => {
            let mut view = json!({"queue": queue, "name": task});
            match mode {
                "ack" => view["acked"] = true.into(),
                "nack" => view["due_at"] = store::rfc3339(now_ms + lease, app.config.timezone).into(),
                _ => {
                    let at = lease_end.unwrap_or(now_ms + lease);
                    view["lease_id"] = answer.lease_id.into();
                    view["lease_expires_at"] = store::rfc3339(at, app.config.timezone).into();
                    view["lease_expires_ms"] = at.into();
                }
            }
            Ok(Json(view))
        }
        "lease_lost" => Err(ApiError::conflict(
            "lease_lost",
            format!("task `{task}` is not under lease `{}`: the lease ran out and the task was leased again, or it was given back, run or deleted", answer.lease_id),
        )),
        "not_pull" => Err(bad(
            "push_queue",
            format!("task `{task}` is a push task: its queue's hosts run it, nobody leases it"),
        )),
        _ => Err(ApiError::not_found(format!(
            "no task `{task}` in queue `{queue}`"
        ))),
    }
}

#[utoipa::path(
    post,
    path = "/queues/{name}/tasks/{task}/ack",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    request_body(content = LeaseAnswer, example = json!({"lease_id": "7d1c2b0e9f8a4c3b"})),
    responses(
        (status = 200, description = "Done: the task is deleted.", body = LeaseChanged),
        (status = 400, description = "A field that does not parse, or a push task.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
        (status = 409, description = "Not under this lease any more (`lease_lost`).", body = ErrorBody),
    )
)]
pub(crate) async fn ack_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    answer_lease(&app, &queue, &task, "ack", body).await
}

#[utoipa::path(
    post,
    path = "/queues/{name}/tasks/{task}/extend",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    request_body(content = LeaseAnswer, example = json!({"lease_id": "7d1c2b0e9f8a4c3b"})),
    responses(
        (status = 200, description = "The lease lasts `lease_seconds` (default 60) from now.", body = LeaseChanged),
        (status = 400, description = "A field that does not parse, or a push task.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
        (status = 409, description = "Not under this lease any more (`lease_lost`).", body = ErrorBody),
    )
)]
pub(crate) async fn extend_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    answer_lease(&app, &queue, &task, "extend", body).await
}

#[utoipa::path(
    post,
    path = "/queues/{name}/tasks/{task}/nack",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    request_body(content = LeaseAnswer, example = json!({"lease_id": "7d1c2b0e9f8a4c3b"})),
    responses(
        (status = 200, description = "Given back: due again after `lease_seconds` (default now).", body = LeaseChanged),
        (status = 400, description = "A field that does not parse, or a push task.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
        (status = 409, description = "Not under this lease any more (`lease_lost`).", body = ErrorBody),
    )
)]
pub(crate) async fn nack_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    answer_lease(&app, &queue, &task, "nack", body).await
}
