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

pub(crate) async fn authorize(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let needed = required_scope(&method, &path);
    // Every change is audited (who, what, the answer); reads are not.
    let audit = |who: &str, response: Response| {
        if needed >= Scope::Book || response.status() == StatusCode::UNAUTHORIZED {
            tracing::info!(target: "kairos::audit", who, %method, path, status = response.status().as_u16(), "audit");
        }
        response
    };
    if app.config.api_tokens.is_empty() {
        let response = next.run(request).await;
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
    let response = next.run(request).await;
    audit(&who, response)
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
