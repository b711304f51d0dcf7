//! The web dashboard at `/ui/` (SPEC section 9): a page and its scripts, compiled into the
//! binary, that run in the browser and call the REST API with the operator's token; and
//! the API reference at `/docs`, a page that shows `/openapi.json`.
//!
//! These routes are not part of the REST API: they are not in `/openapi.json`, and they
//! answer without a token, since the page and its scripts hold no data (every figure on
//! the page comes from the API, under the token's scope). The assets are plain HTML, CSS
//! and JavaScript modules in `api/ui/`: nothing to build, nothing fetched from elsewhere.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;

/// Every file the page uses: name under `/ui/`, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("ui/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "lib.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/lib.js"),
    ),
    (
        "pages.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/pages.js"),
    ),
    (
        "failures.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/failures.js"),
    ),
    (
        "queues.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/queues.js"),
    ),
    (
        "docs.html",
        "text/html; charset=utf-8",
        include_str!("ui/docs.html"),
    ),
    (
        "docs.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/docs.js"),
    ),
    (
        "docs.css",
        "text/css; charset=utf-8",
        include_str!("ui/docs.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("ui/favicon.svg"),
    ),
];

/// Only the page's own files and calls to its own origin; no inline script or style, so
/// that text from the API can never run as code even if it reached the DOM as markup.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/ui` (to `/ui/`, so that the page's relative links hold behind a path prefix),
/// `/ui/` and `/ui/{file}`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("ui/") }))
        // The API reference: the document's routes and schemas, read from
        // /openapi.json in the browser.
        .route("/docs", get(|| async { asset("docs.html") }))
        .route("/ui/", get(|| async { asset("") }))
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>| async move { asset(&file) }),
        )
}

fn asset(name: &str) -> Response {
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::not_found(format!("the dashboard has no file `{name}`")).into_response();
    };
    let mut response = (StatusCode::OK, *body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change with the binary: revalidated each time (cheap, and never stale after
    // an upgrade).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        // A file imported by a script or linked by the page but missing from ASSETS would
        // be a 404 in the browser: check the names the sources mention.
        for (name, _, body) in ASSETS {
            for quoted in body.split(['"', '\'']).filter(|s| {
                s.starts_with("./")
                    && (s.ends_with(".js") || s.ends_with(".css") || s.ends_with(".svg"))
            }) {
                let file = quoted.trim_start_matches("./");
                assert!(
                    ASSETS.iter().any(|(n, _, _)| *n == file),
                    "{name} refers to {quoted}, which is not served"
                );
            }
        }
    }

    #[test]
    fn assets_carry_no_inline_script_and_no_inner_html() {
        let page = ASSETS[0].2;
        assert!(
            !page.contains("<script>"),
            "inline scripts are refused by the CSP"
        );
        for (name, _, body) in ASSETS {
            assert!(
                !body.contains("innerHTML") && !body.contains("insertAdjacentHTML"),
                "{name}: API data goes into the DOM as text only"
            );
        }
    }
}
