//! `GET /openapi.json`: the OpenAPI 3.1 document of this API, generated from the
//! handlers' `#[utoipa::path]` attributes and the types they read and answer with.
//!
//! The router registers each route and its documentation in one call
//! (`utoipa_axum::routes!`), so a route cannot be served without being documented;
//! [`finish`] then adds what every route shares: the bearer security scheme, the scope
//! each route needs, and the error answers that the layers in front of the handlers give
//! (401/403 from the token check, 408/413 for bodies, 503/507 when Redis fails).

use axum::body::Bytes;
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};

use crate::error::ErrorBody;

/// What the derive gives: the document's info, tags, the defer route (served by
/// `any()`, which `routes!` cannot register) and the shared schemas.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "kairos",
        description = "A scheduler host: book actions (webhooks or WebAssembly plugins) at absolute times over REST; recurring timers and task queues on the same engine.\n\nEvery refusal answers with one body, `{\"error\": {\"code\": \"snake_case_reason\", \"message\": \"...\"}}`. With `api_tokens` configured, every route but `/healthz` and `/readyz` needs `Authorization: Bearer <token>` of the scope named on it (`admin` ⊇ `book` ⊇ `read`).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(super::defer::defer_request),
    components(schemas(ErrorBody, super::schedules::SortOrder)),
    security(("bearer" = [])),
    tags(
        (name = "schedules", description = "Lives: point and term bookings."),
        (name = "defer", description = "Any request, replayed later."),
        (name = "timers", description = "Recurring timers."),
        (name = "queues", description = "Task queues, push and pull."),
        (name = "plugins", description = "WebAssembly action plugins."),
        (name = "operations", description = "Health, readiness, metrics, this document."),
    )
)]
pub(crate) struct ApiDoc;

/// The document as served, serialized once.
#[derive(Clone)]
pub(crate) struct OpenApiJson(pub Bytes);

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API (no token needed; a reference page at `/docs` shows it).", body = serde_json::Value))
)]
pub(crate) async fn openapi_json(Extension(doc): Extension<OpenApiJson>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], doc.0).into_response()
}

/// The document as served: [`AnyJson`] written in place as the empty schema `{}` (with
/// its description) wherever it is used, an optional one not wrapped in
/// `oneOf: [.., null]` (`{}` takes null already, and `oneOf` would then match twice).
///
/// [`AnyJson`]: crate::bookings::request::AnyJson
pub(crate) fn served(doc: &OpenApi) -> Vec<u8> {
    fn any_json(node: &mut serde_json::Value) {
        use serde_json::{json, Value};
        const ANY: &str = "#/components/schemas/AnyJson";
        let is_any = |v: &Value| v.get("$ref").and_then(Value::as_str) == Some(ANY);
        match node {
            Value::Object(map) => {
                let nullable_any =
                    map.get("oneOf")
                        .and_then(Value::as_array)
                        .is_some_and(|items| {
                            items.len() == 2
                                && items.iter().any(is_any)
                                && items.iter().any(|i| i.get("type") == Some(&json!("null")))
                        });
                if nullable_any {
                    let any = map["oneOf"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|i| is_any(i))
                        .cloned();
                    map.remove("oneOf");
                    if let Some(Value::Object(any)) = any {
                        map.extend(any);
                    }
                }
                if map.get("$ref").and_then(Value::as_str) == Some(ANY) {
                    map.remove("$ref");
                    map.entry("description")
                        .or_insert_with(|| "Any JSON value.".into());
                }
                map.values_mut().for_each(any_json);
            }
            Value::Array(items) => items.iter_mut().for_each(any_json),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    if let Some(schemas) = value["components"]["schemas"].as_object_mut() {
        schemas.remove("AnyJson");
    }
    any_json(&mut value);
    serde_json::to_vec(&value).expect("the OpenAPI document serializes")
}

/// Adds what every route shares (see the module's doc) to the document the router made.
pub(crate) fn finish(doc: &mut OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token of --api-tokens (`[name@]TOKEN:scope`); needed only when the host has tokens.",
                ))
                .build(),
        ),
    );
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc.paths.paths.iter_mut() {
        for (method, operation) in operations(item) {
            // One handler serving several methods (`/defer`) has one name: an operation
            // id is unique in a document, so the others get the method's.
            if let Some(id) = operation.operation_id.as_mut() {
                if !ids.insert(id.clone()) {
                    id.push('_');
                    id.push_str(&method.as_str().to_ascii_lowercase());
                    ids.insert(id.clone());
                }
            }
            complete(path, &method, operation);
        }
    }
}

fn operations(item: &mut PathItem) -> Vec<(Method, &mut Operation)> {
    [
        (Method::GET, item.get.as_mut()),
        (Method::PUT, item.put.as_mut()),
        (Method::POST, item.post.as_mut()),
        (Method::DELETE, item.delete.as_mut()),
        (Method::PATCH, item.patch.as_mut()),
        (Method::HEAD, item.head.as_mut()),
        (Method::OPTIONS, item.options.as_mut()),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.map(|op| (m, op)))
    .collect()
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

fn complete(path: &str, method: &Method, op: &mut Operation) {
    // A route marked `security(())` answers without a token (health and readiness).
    let open = op
        .security
        .as_ref()
        .is_some_and(|s| s.iter().all(|r| r == &Default::default()));
    let responses = &mut op.responses.responses;
    let mut add = |status: &str, description: &str| {
        responses
            .entry(status.to_string())
            .or_insert_with(|| error_response(description));
    };
    if !open {
        let scope = format!("{:?}", super::auth::required_scope(method, path)).to_lowercase();
        add(
            "401",
            "No token, another scheme than Bearer, or an unknown token (`unauthorized`); the answer carries `WWW-Authenticate: Bearer`.",
        );
        add(
            "403",
            &format!(
                "The token's scope is below `{scope}`, the one this route needs (`forbidden`)."
            ),
        );
        let description = op.description.get_or_insert_with(String::new);
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(&format!("Scope: `{scope}`."));
    }
    let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    if op.request_body.is_some() || has_params {
        add(
            "400",
            "A path segment, query string or body that does not parse.",
        );
    }
    if op.request_body.is_some() {
        add(
            "408",
            "The body did not arrive within the body timeout (`body_timeout`).",
        );
        add(
            "413",
            "The body is larger than the configured limit (`body_too_large`).",
        );
    }
    if path == "/openapi.json" {
        return;
    }
    add(
        "503",
        "Redis is not answering (`storage_unavailable`; `stored: \"unknown\"` when a write may or may not have been applied).",
    );
    if !open && path != "/metrics" {
        add(
            "507",
            "Redis is nearly full or refused a write for want of memory (`storage_full`); nothing was stored.",
        );
    }
}
