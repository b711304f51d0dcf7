//! Bearer tokens and scopes: which scope a route needs, and the check in front of every
//! route but health and readiness.

use crate::config::Scope;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// The scope a request needs: reading needs `read`; bookings need `book`; everything
/// else (plugins, queues, timers administration) needs `admin`. The scope follows what a
/// route does, not its method: every `/defer` route books, a GET too.
pub(crate) fn required_scope(method: &Method, path: &str) -> Scope {
    if path == "/defer" || path.starts_with("/defer/") {
        Scope::Book
    } else if method == Method::GET || method == Method::HEAD || path == "/timers/validate" {
        // Validating a schedule changes nothing.
        Scope::Read
    } else if path.starts_with("/schedules") || super::queues::is_task_path(path) {
        // Adding, deleting and running queue tasks is booking work; defining queues and
        // timers is administration.
        Scope::Book
    } else {
        Scope::Admin
    }
}

/// A request's id: the caller's `X-Request-Id` when it is a sane one (1 to 64 visible
/// ASCII characters), else a new one; answered as `X-Request-Id` and named by the audit
/// line, so that a client's report of a call finds the host's line for it.
#[derive(Clone, Debug)]
pub(crate) struct RequestId(pub String);

/// The object a change made or touched, beyond what its path names (a new Life's id, a
/// plugin's digest), for its audit line: put on the response by the handler.
#[derive(Clone, Debug)]
pub(crate) struct Audited(pub String);

/// What the path of a change names: `life=ID`, `timer=NAME`, `queue=NAME task=NAME`,
/// `plugin=NAME` (empty for other routes).
pub(crate) fn object_of_path(path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["schedules", "batch"] | ["schedules"] | ["timers"] | ["timers", "validate"] => {
            String::new()
        }
        ["schedules", id, ..] => format!("life={id}"),
        ["timers", name, ..] => format!("timer={name}"),
        ["queues", q, "tasks", task, ..] => format!("queue={q} task={task}"),
        ["queues", q, ..] => format!("queue={q}"),
        ["plugins", name, ..] => format!("plugin={name}"),
        _ => String::new(),
    }
}

/// What a booking call's answer names: the Life it booked, the timer it made, the tasks
/// it added, how many Lives a batch booked.
pub(crate) fn object_of_answer(body: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let text = |v: &Value| v.as_str().map(str::to_string);
    if let Some(id) = text(&body["life_uuid"]) {
        return Some(format!("life={id}"));
    }
    if let (Some(booked), Some(refused)) = (body["booked"].as_u64(), body["refused"].as_u64()) {
        return Some(format!("lives_booked={booked} lives_refused={refused}"));
    }
    if let Some(queue) = text(&body["queue"]) {
        let tasks = match (&body["name"], &body["tasks"]) {
            (Value::String(name), _) => format!("task={name}"),
            (_, Value::Array(tasks)) => {
                let names: Vec<&str> = tasks.iter().filter_map(|t| t["name"].as_str()).collect();
                format!("tasks={}", names.join(","))
            }
            _ => String::new(),
        };
        return Some(format!("queue={queue} {tasks}").trim_end().to_string());
    }
    if let (Some(name), Some(_)) = (text(&body["name"]), body.get("schedule")) {
        return Some(format!("timer={name}"));
    }
    None
}

pub(crate) async fn authorize(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let needed = required_scope(&method, &path);
    let started = std::time::Instant::now();
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let client = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "-".into());
    // Every change is audited (who, what, on which object, the answer, how long, from
    // where, under which request id); reads are not.
    let audit = |who: &str, response: Response| {
        if needed >= Scope::Book || response.status() == StatusCode::UNAUTHORIZED {
            let object = match response.extensions().get::<Audited>() {
                Some(Audited(object)) => object.clone(),
                None => object_of_path(&path),
            };
            let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
            tracing::info!(
                target: "kairos::audit",
                who,
                %method,
                path,
                object,
                status = response.status().as_u16(),
                latency_ms = format!("{latency_ms:.1}"),
                client,
                request_id,
                "audit"
            );
        }
        response
    };
    if app.config.api_tokens.is_empty() {
        let response = with_scope(next.run(request).await, Scope::Admin);
        return audit("open", response);
    }
    let presented = match bearer_token(request.headers().get(header::AUTHORIZATION)) {
        Ok(token) => token,
        Err(why) => return audit("anonymous", unauthorized(why, false)),
    };
    // Compare every token in full so timing does not reveal a prefix match.
    let granted = app
        .config
        .api_tokens
        .iter()
        .filter(|t| constant_time_eq(t.token.as_bytes(), presented.as_bytes()))
        .max_by_key(|t| t.scope);
    let Some(granted) = granted else {
        return audit(
            "unknown-token",
            unauthorized("unknown API token".into(), true),
        );
    };
    let who = granted.name.clone();
    if granted.scope < needed {
        let refused = ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this token has scope `{:?}`; this route needs `{needed:?}`",
                granted.scope
            )
            .to_lowercase(),
        )
        .into_response();
        return audit(&who, refused);
    }
    let response = with_scope(next.run(request).await, granted.scope);
    audit(&who, response)
}

/// Names the scope the request was granted (`X-Kairos-Scope: read|book|admin`), so that
/// a client such as the dashboard can show what this token may not do as disabled.
fn with_scope(mut response: Response, scope: Scope) -> Response {
    let name = match scope {
        Scope::Read => "read",
        Scope::Book => "book",
        Scope::Admin => "admin",
    };
    response
        .headers_mut()
        .insert("x-kairos-scope", header::HeaderValue::from_static(name));
    response
}

/// The token of an `Authorization: Bearer <token>` header. The scheme is
/// case-insensitive (RFC 7235 section 2.1); a missing header, another scheme and an
/// empty token each get a message of their own.
pub(crate) fn bearer_token(value: Option<&header::HeaderValue>) -> Result<&str, String> {
    let Some(value) = value else {
        return Err("this route needs `Authorization: Bearer <token>`".into());
    };
    let text = value
        .to_str()
        .map_err(|_| "the Authorization header is not text".to_string())?
        .trim();
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(format!(
            "the Authorization header uses the `{}` scheme; this API takes `Authorization: Bearer <token>`",
            scheme.chars().take(20).collect::<String>()
        ));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err("the Authorization header has the Bearer scheme but no token".into());
    }
    Ok(token)
}

/// 401 with the challenge RFC 6750 asks for: `WWW-Authenticate: Bearer`, with
/// `error="invalid_token"` when a token was given but is not known.
pub(crate) fn unauthorized(message: String, invalid_token: bool) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    let challenge = if invalid_token {
        r#"Bearer realm="kairos", error="invalid_token""#
    } else {
        r#"Bearer realm="kairos""#
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(challenge),
    );
    response
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_method_and_route() {
        assert_eq!(required_scope(&Method::GET, "/schedules"), Scope::Read);
        assert_eq!(required_scope(&Method::POST, "/schedules"), Scope::Book);
        assert_eq!(required_scope(&Method::DELETE, "/schedules/x"), Scope::Book);
        assert_eq!(required_scope(&Method::PUT, "/plugins/x"), Scope::Admin);
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/tasks"),
            Scope::Book
        );
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/tasks/t/run"),
            Scope::Book
        );
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/purge"),
            Scope::Admin
        );
        assert_eq!(required_scope(&Method::PUT, "/queues/q"), Scope::Admin);
        // A pull queue's workers lease and answer with the book scope.
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/lease"),
            Scope::Book
        );
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/tasks/t/ack"),
            Scope::Book
        );
        assert_eq!(required_scope(&Method::POST, "/queues/lease"), Scope::Admin);
        assert_eq!(required_scope(&Method::POST, "/timers"), Scope::Admin);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
