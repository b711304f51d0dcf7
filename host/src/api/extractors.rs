//! Extractors whose refusals are the spec's error body rather than axum's plain text.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A route's query string read into `T` (which documents it as `IntoParams`): a
/// parameter of the wrong type, a repeated one or one the route does not take is a 400
/// `invalid_query` naming it.
pub(crate) struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| {
                let text = rejection.body_text();
                let reason = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text);
                ApiError::bad_request("invalid_query", format!("the query string: {reason}"))
            })
    }
}

/// A list's `?limit=`: 1 to 1000, 100 when not given.
pub(crate) fn page_limit(limit: Option<u32>) -> Result<usize, ApiError> {
    match limit.unwrap_or(100) {
        n @ 1..=1000 => Ok(n as usize),
        _ => Err(ApiError::bad_request(
            "invalid_query",
            "limit must be 1 to 1000",
        )),
    }
}

/// Reads a `true`/`false` flag (`1`/`0` too) of a query string.
pub(crate) fn flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::bad_request(
            "invalid_query",
            format!("{name} `{other}` is not true or false"),
        )),
    }
}
