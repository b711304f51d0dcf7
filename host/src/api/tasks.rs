//! A queue's tasks: adding them, listing a queue's tasks and its failed list a page at a
//! time, showing one with its attempts, running and deleting one (SPEC section 6).

use super::{body_bytes, idempotent, App, Shared};
use crate::bookings::idempotency::Answer;
use crate::error::ApiError;
use crate::model::check_name;
use crate::store::{self, NewTask, NewTaskWork, TaskAddRefusal};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};

use super::extractors::Query;
use super::queues::{load_queue, not_found};
use super::views::{NewTasks, TaskChanged, TaskList, TaskView, TasksAddedAnswer};
use crate::error::ErrorBody;

use crate::queues::{bad, parse_task, QueueDef, TaskWork, MAX_TASKS_PER_CALL, TASK_TOMBSTONE_MS};

/// Adds one task, or a list of at most 100 (all or none).
#[utoipa::path(
    post,
    path = "/queues/{name}/tasks",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and body get the first answer.")),
    request_body(description = "One task, a list of at most 100, or `{\"tasks\": [...]}`.", content(
        (NewTasks = "application/json", example = json!({"name": "invoice-42", "countdown": 30, "action": {"path": "/invoices/42/send", "method": "POST"}}))
    )),
    responses(
        (status = 200, description = "Added: the task, or `{\"tasks\": [...]}` when the body was a list.", body = TasksAddedAnswer),
        (status = 400, description = "A task that does not parse, an action for a pull queue or a payload for a push queue.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
        (status = 409, description = "A task name in use or recently used (`duplicate_task`).", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn add_tasks(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    check_name("queue name", &queue, 100)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let (app, queue, body) = (&app, &queue, &body);
    let route = format!("POST /queues/{queue}/tasks");
    idempotent(app, &headers, &[route.as_bytes(), body], |key| async move {
        let Json(view) = add_tasks_keyed(app, queue, body, key).await?;
        Ok((StatusCode::OK, view))
    })
    .await
}

/// Adds tasks; under an `Idempotency-Key` (`key`), tasks given no name are named from the
/// key, so that a repeat of a call whose answer was lost meets its tasks (409
/// `duplicate_task`) instead of adding them twice.
async fn add_tasks_keyed(
    app: &App,
    queue: &str,
    body: &[u8],
    key: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad("invalid_json", format!("the body is not valid JSON: {e}")))?;
    let (list, single) = match value {
        Value::Array(items) => (items, false),
        Value::Object(mut o) if o.contains_key("tasks") => match o.remove("tasks") {
            Some(Value::Array(items)) => (items, false),
            _ => return Err(bad("invalid_body", "tasks must be a list")),
        },
        v @ Value::Object(_) => (vec![v], true),
        _ => {
            return Err(bad(
                "invalid_body",
                "the body must be a task or a list of tasks",
            ))
        }
    };
    if list.is_empty() || list.len() > MAX_TASKS_PER_CALL {
        return Err(bad(
            "invalid_body",
            format!("give 1 to {MAX_TASKS_PER_CALL} tasks"),
        ));
    }
    let now_ms = app.clock.now_ms();
    let mut tasks = Vec::with_capacity(list.len());
    let mut names = BTreeSet::new();
    for (n, item) in list.into_iter().enumerate() {
        let fresh_name = key
            .as_deref()
            .map(|key| crate::bookings::idempotency::derived_id(key, n as u32));
        let task = parse_task(item, now_ms, app.config.timezone, fresh_name)?;
        let name = task.name;
        if !names.insert(name.clone()) {
            return Err(ApiError::conflict(
                "duplicate_task",
                format!("task `{name}` is given twice"),
            ));
        }
        let work = match task.work {
            TaskWork::Action(action) => {
                let action = app.parse_action("action", &action, now_ms).await?;
                NewTaskWork::Action(serde_json::to_string(&action).expect("actions serialize"))
            }
            TaskWork::Payload { payload, tag } => NewTaskWork::Payload {
                payload_json: payload.to_string(),
                tag,
            },
        };
        tasks.push(NewTask {
            name,
            eta_ms: task.eta_ms,
            expires_at_ms: task.expires_at_ms,
            work,
        });
    }
    match app
        .store
        .task_add(queue, &tasks, &QueueDef::defaults_json(), now_ms, app.notify_before_ms(now_ms))
        .await?
    {
        Ok(()) => {}
        Err(TaskAddRefusal::Duplicate(name)) => {
            return Err(ApiError::conflict(
                "duplicate_task",
                format!("queue `{queue}` has or recently had a task named `{name}`; names are kept for an hour after a task ends"),
            ))
        }
        Err(TaskAddRefusal::Mode { pull }) => {
            return Err(bad(
                "invalid_body",
                if pull {
                    format!("queue `{queue}` is a pull queue: its tasks carry a payload (and a tag), not an action")
                } else {
                    format!("queue `{queue}` is a push queue: its tasks carry an action, not a payload")
                },
            ))
        }
        Err(TaskAddRefusal::Missing) => return Err(not_found(queue)),
    }
    let tz = app.config.timezone;
    let views: Vec<Value> = tasks
        .iter()
        .map(|t| {
            let mut view = json!({
                "queue": queue,
                "name": t.name,
                "eta": store::rfc3339(t.eta_ms, tz),
                "eta_ms": t.eta_ms,
            });
            if let Some(at) = t.expires_at_ms {
                view["expires_at"] = store::rfc3339(at, tz).into();
            }
            view
        })
        .collect();
    if single {
        Ok(Json(views.into_iter().next().expect("one task")))
    } else {
        Ok(Json(json!({"tasks": views})))
    }
}

pub(crate) fn task_json(
    queue: &str,
    name: &str,
    t: &HashMap<String, String>,
    tz: chrono_tz::Tz,
) -> Value {
    let text = |k: &str| t.get(k).cloned().map(Value::String).unwrap_or(Value::Null);
    let num = |k: &str| {
        t.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    let time = |k: &str| {
        t.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(|ms| Value::String(store::rfc3339(ms, tz)))
            .unwrap_or(Value::Null)
    };
    let mut view = json!({
        "queue": queue,
        "name": name,
        "state": text("state"),
        "eta": time("fire_at_ms"),
        "eta_ms": num("fire_at_ms"),
        "expires_at": t
            .get("expires_at_ms")
            .and_then(|at| at.parse().ok())
            .map(|at| store::rfc3339(at, tz)),
        // `attempts` is written with the first run.
        "attempts": num("attempts").as_i64().unwrap_or(0),
        "action": t.get("action").and_then(|a| serde_json::from_str::<Value>(a).ok()),
        "last_status": num("last_status"),
        "last_error": text("last_error"),
        "last_run": t.get("last_run").and_then(|run| run_view(run, tz)),
        // A task dropped by start_run has only the ms (Lua has no time zones).
        "failed_at": t.get("failed_at").cloned().or_else(|| {
            t.get("failed_at_ms")
                .and_then(|at| at.parse().ok())
                .map(|at| store::rfc3339(at, tz))
        }),
        // Tasks added before 0.2 kept an RFC 3339 `created_at`.
        "created_at": match time("created_at_ms") {
            Value::Null => text("created_at"),
            at => at,
        },
    });
    if t.get("pull").map(String::as_str) == Some("1") {
        let obj = view.as_object_mut().expect("an object");
        obj.remove("action");
        obj.remove("expires_at");
        obj.insert(
            "payload".into(),
            t.get("payload")
                .and_then(|p| serde_json::from_str::<Value>(p).ok())
                .unwrap_or(Value::Null),
        );
        obj.insert("tag".into(), text("tag"));
        let lease_end = t
            .get("lease_expires_ms")
            .and_then(|at| at.parse::<i64>().ok());
        if let Some(at) = lease_end {
            obj.insert("lease_expires_at".into(), store::rfc3339(at, tz).into());
            obj.insert("lease_id".into(), text("lease_id"));
        }
    }
    view
}

/// A run record as stored (JSON, times in epoch ms) as the API shows it: as in a Life's
/// history, `name` the time as text and `name_ms` in epoch ms.
fn run_view(text: &str, tz: chrono_tz::Tz) -> Option<Value> {
    let mut run: Value = serde_json::from_str(text).ok()?;
    for field in ["should_run_at", "started_at"] {
        if let Some(ms) = run.get(field).and_then(Value::as_i64) {
            run[format!("{field}_ms")] = Value::from(ms);
            run[field] = Value::String(store::rfc3339(ms, tz));
        }
    }
    Some(run)
}

/// A task's runs, newest first: its `last_run` and the earlier ones its hash keeps
/// (`run:{n}`, the last 9).
fn task_runs(t: &HashMap<String, String>, tz: chrono_tz::Tz) -> Vec<Value> {
    let mut earlier: Vec<(u64, &String)> = t
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("run:")?.parse().ok()?, v)))
        .collect();
    earlier.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    t.get("last_run")
        .into_iter()
        .chain(earlier.into_iter().map(|(_, v)| v))
        .filter_map(|run| run_view(run, tz))
        .collect()
}

pub(crate) async fn list_of(
    app: &App,
    queue: &str,
    failed: bool,
    page: PageQuery,
) -> Result<Json<Value>, ApiError> {
    load_queue(app, queue).await?;
    let limit = (page.limit.unwrap_or(100) as usize).clamp(1, 1000);
    let after = match &page.cursor {
        None => None,
        Some(cursor) => {
            let (score, name) = cursor
                .split_once(':')
                .filter(|(score, _)| score.parse::<f64>().is_ok_and(f64::is_finite))
                .ok_or_else(|| bad("invalid_cursor", "the cursor is not one this list gave"))?;
            Some((score.to_string(), name.to_string()))
        }
    };
    let descending = super::schedules::parse_order(page.order.as_deref())?;
    let found = app
        .store
        .task_page(queue, failed, limit, after, descending)
        .await?;
    let items: Vec<Value> = found
        .tasks
        .into_iter()
        .filter(|(_, t)| !t.is_empty())
        .map(|(name, t)| task_json(queue, &name, &t, app.config.timezone))
        .collect();
    let next_cursor = found.next.map(|(score, name)| format!("{score}:{name}"));
    Ok(Json(json!({
        "queue": queue,
        "items": items,
        "next_cursor": next_cursor,
        "total": found.total,
    })))
}

/// `?limit=&cursor=&order=` of a queue's task lists.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// At most this many, 1 to 1000 (default 100).
    #[param(minimum = 0)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
    /// `asc` (default): the earliest first (by ETA; on the failed list, by failure
    /// time); `desc`: the latest first.
    #[param(value_type = Option<super::schedules::SortOrder>)]
    order: Option<String>,
}

/// `?state=&limit=&cursor=&order=` of a queue's task list.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TaskListQuery {
    /// `failed`: the failed list; `pending` (default): the tasks waiting or running.
    #[param(inline, value_type = Option<TaskListState>)]
    state: Option<String>,
    /// At most this many, 1 to 1000 (default 100).
    #[param(minimum = 0)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
    /// `asc` (default): the earliest first; `desc`: the latest first.
    #[param(value_type = Option<super::schedules::SortOrder>)]
    order: Option<String>,
}

/// Which of a queue's lists.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum TaskListState {
    Pending,
    Failed,
}

/// A queue's tasks, waiting or running, by ETA.
#[utoipa::path(
    get,
    path = "/queues/{name}/tasks",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), TaskListQuery),
    responses(
        (status = 200, description = "Its tasks.", body = TaskList),
        (status = 400, description = "Not a queue name, or a query that does not parse.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn list_tasks(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    Query(query): Query<TaskListQuery>,
) -> Result<Json<Value>, ApiError> {
    let failed = match query.state.as_deref() {
        None | Some("pending") => false,
        Some("failed") => true,
        Some(other) => {
            return Err(bad(
                "invalid_query",
                format!("state `{other}` is not pending or failed"),
            ))
        }
    };
    let page = PageQuery {
        limit: query.limit,
        cursor: query.cursor,
        order: query.order,
    };
    list_of(&app, &queue, failed, page).await
}

/// A queue's failed list: tasks that ran out of retries (or expired).
#[utoipa::path(
    get,
    path = "/queues/{name}/failed",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), PageQuery),
    responses(
        (status = 200, description = "Its failed tasks, a page at a time.", body = TaskList),
        (status = 400, description = "Not a queue name, a limit that is not a number, an order that is not asc or desc, or a cursor this list did not give.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn list_failed(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    list_of(&app, &queue, true, query).await
}

#[utoipa::path(
    get,
    path = "/queues/{name}/tasks/{task}",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    responses(
        (status = 200, description = "The task.", body = TaskView),
        (status = 400, description = "Not a queue or task name.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
    )
)]
pub(crate) async fn show_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &queue, 100)?;
    check_name("task name", &task, 500)?;
    match app.store.task_load(&queue, &task).await? {
        Some(t) => {
            let mut view = task_json(&queue, &task, &t, app.config.timezone);
            view["runs"] = Value::from(task_runs(&t, app.config.timezone));
            Ok(Json(view))
        }
        None => Err(ApiError::not_found(format!(
            "no task `{task}` in queue `{queue}`"
        ))),
    }
}

pub(crate) async fn change_task(
    app: &App,
    queue: &str,
    task: &str,
    mode: &str,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", queue, 100)?;
    check_name("task name", task, 500)?;
    let now_ms = app.clock.now_ms();
    match app
        .store
        .task_change(
            queue,
            task,
            mode,
            now_ms,
            app.notify_before_ms(now_ms),
            TASK_TOMBSTONE_MS,
        )
        .await?
        .as_str()
    {
        "ok" if mode == "delete" => {
            Ok(Json(json!({"queue": queue, "name": task, "deleted": true})))
        }
        "ok" => Ok(Json(
            json!({"queue": queue, "name": task, "run_at_ms": now_ms}),
        )),
        "running" => Err(ApiError::conflict(
            "task_running",
            format!("task `{task}` is running now; try again when it returns"),
        )),
        _ => Err(ApiError::not_found(format!(
            "no task `{task}` in queue `{queue}`"
        ))),
    }
}

#[utoipa::path(
    delete,
    path = "/queues/{name}/tasks/{task}",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    responses(
        (status = 200, description = "Deleted (its name stays taken for an hour).", body = TaskChanged),
        (status = 400, description = "Not a queue or task name.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
        (status = 409, description = "It is running now (`task_running`).", body = ErrorBody),
    )
)]
pub(crate) async fn delete_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    change_task(&app, &queue, &task, "delete").await
}

/// Runs a task now: a waiting one, or a failed one again.
#[utoipa::path(
    post,
    path = "/queues/{name}/tasks/{task}/run",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name."), ("task" = String, Path, description = "The task's name.")),
    responses(
        (status = 200, description = "Due now.", body = TaskChanged),
        (status = 400, description = "Not a queue or task name.", body = ErrorBody),
        (status = 404, description = "No such task.", body = ErrorBody),
        (status = 409, description = "It is running now (`task_running`).", body = ErrorBody),
    )
)]
pub(crate) async fn run_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    change_task(&app, &queue, &task, "run").await
}
