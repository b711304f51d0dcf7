//! `GET /openapi.json` (SPEC section 9): an OpenAPI 3.1 document that lists every route
//! the host serves, with its methods, parameters, body schemas and error answers, behind
//! the read scope like every other GET. `scripts/api_fuzz.py` fuzzes the API against it.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::Method;
use kairos_e2e::{fast_flags, Api, Host, RedisServer};
use serde_json::Value;

/// Every route the router serves, with its methods (`/defer/{path}` takes any method;
/// these are the ones documented). A route added to the router without being added here
/// fails `every_route_is_documented`, and one documented but not served fails it too.
const ROUTES: &[(&str, &[&str])] = &[
    ("/schedules", &["get", "post"]),
    ("/schedules/{life_uuid}", &["get", "patch", "delete"]),
    ("/defer/{path}", &["get", "post", "put", "patch", "delete"]),
    ("/plugins", &["get"]),
    ("/plugins/{name}", &["get", "put", "delete"]),
    ("/timers", &["get", "post"]),
    ("/timers/{name}", &["get", "patch", "delete"]),
    ("/timers/{name}/run", &["post"]),
    ("/timers/{name}/activate", &["post"]),
    ("/timers/{name}/deactivate", &["post"]),
    ("/timers/{name}/runs", &["get"]),
    ("/timers/validate", &["post"]),
    ("/queues", &["get"]),
    ("/queues/{name}", &["get", "put", "delete"]),
    ("/queues/{name}/pause", &["post"]),
    ("/queues/{name}/resume", &["post"]),
    ("/queues/{name}/purge", &["post"]),
    ("/queues/{name}/tasks", &["get", "post"]),
    ("/queues/{name}/failed", &["get"]),
    ("/queues/{name}/tasks/{task}", &["get", "delete"]),
    ("/queues/{name}/tasks/{task}/run", &["post"]),
    ("/queues/{name}/lease", &["post"]),
    ("/queues/{name}/tasks/{task}/ack", &["post"]),
    ("/queues/{name}/tasks/{task}/extend", &["post"]),
    ("/queues/{name}/tasks/{task}/nack", &["post"]),
    ("/metrics", &["get"]),
    ("/clock", &["get", "post"]),
    ("/openapi.json", &["get"]),
    ("/healthz", &["get"]),
    ("/readyz", &["get"]),
];

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

fn host(redis: &RedisServer) -> Host {
    let mut flags = fast_flags();
    flags.extend(
        ["--api-tokens", "r3ad:read,adm1n:admin"]
            .iter()
            .map(|s| s.to_string()),
    );
    Host::start(&redis.url(), &flags)
}

/// The schema a `$ref` names (`#/components/schemas/X`), or the value itself; an optional
/// field's schema is `oneOf: [that, null]`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    if let Some(one) = schema["oneOf"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["type"] != "null"))
    {
        return resolve(doc, one);
    }
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r
                .strip_prefix("#/components/schemas/")
                .expect("a schema ref");
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

fn documented(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|m| METHODS.contains(&m.as_str()))
                .cloned()
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_openapi_3_1_behind_the_read_scope() {
    let redis = RedisServer::start();
    let host = host(&redis);
    let anon = Api::new(&host);

    let (status, body) = anon.get("/openapi.json").await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");

    let (status, headers, doc) = anon
        .with_token("r3ad")
        .call(Method::GET, "/openapi.json", Vec::new(), &[])
        .await;
    assert_eq!(status, 200, "{doc}");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"),
        "{headers:?}"
    );
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["title"], "kairos");
    // The bearer scheme, required everywhere but health and readiness.
    let scheme = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(scheme["type"], "http", "{scheme}");
    assert_eq!(scheme["scheme"], "bearer", "{scheme}");
    assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
    for open in ["/healthz", "/readyz"] {
        assert_eq!(
            doc["paths"][open]["get"]["security"],
            serde_json::json!([{}]),
            "{open} needs no token"
        );
        assert!(doc["paths"][open]["get"]["responses"]["401"].is_null());
    }
    assert!(doc["paths"]["/schedules"]["post"]["description"]
        .as_str()
        .unwrap()
        .contains("Scope: `book`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_documented_and_every_documented_route_is_served() {
    let redis = RedisServer::start();
    let host = host(&redis);
    let admin = Api::new(&host).with_token("adm1n");
    let (status, doc) = admin.get("/openapi.json").await;
    assert_eq!(status, 200);

    let expected: BTreeMap<String, BTreeSet<String>> = ROUTES
        .iter()
        .map(|(path, methods)| {
            (
                path.to_string(),
                methods.iter().map(|m| m.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(documented(&doc), expected);

    // Each documented operation is served: whatever the handler answers to a made-up
    // name, it is not the router's "no route" or "method not allowed".
    for (path, methods) in ROUTES {
        let concrete = path
            .replace("{life_uuid}", "no-such-life")
            .replace("{name}", "nosuch")
            .replace("{task}", "nosuch")
            .replace("{path}", "some/where");
        for method in *methods {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let (status, body) = admin.raw(method.clone(), &concrete, Vec::new(), &[]).await;
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(
                status != 405 && !message.starts_with("no route for"),
                "{method} {concrete} is documented but not served: {status} {body}"
            );
        }
    }
    // And a route that is not documented is not served.
    assert_eq!(admin.get("/openapi.yaml").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_hold_the_fields_the_spec_names() {
    let redis = RedisServer::start();
    let host = host(&redis);
    let (status, doc) = Api::new(&host)
        .with_token("r3ad")
        .get("/openapi.json")
        .await;
    assert_eq!(status, 200);
    let props = |schema: &Value| -> BTreeSet<String> {
        resolve(&doc, schema)["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("an object schema: {schema}"))
            .keys()
            .cloned()
            .collect()
    };

    // The booking body: both spellings of SPEC section 2, and nothing else accepted.
    let post = &doc["paths"]["/schedules"]["post"];
    let body = &post["requestBody"]["content"]["application/json"]["schema"];
    let booking = props(body);
    for field in [
        "life_uuid",
        "schedule_type",
        "resource_id",
        "term",
        "birth_time",
        "death_time",
        "birth",
        "death",
        "birth_action",
        "death_action",
    ] {
        assert!(
            booking.contains(field),
            "booking body lacks {field}: {booking:?}"
        );
    }
    assert_eq!(
        resolve(&doc, body)["additionalProperties"],
        false,
        "unknown fields are refused (400 unknown_field)"
    );
    let term = props(&resolve(&doc, body)["properties"]["term"]);
    assert!(term.contains("birth_time") && term.contains("death_time"));
    // The spec's example booking.
    assert_eq!(
        resolve(&doc, body)["example"]["resource_id"],
        "conn-42",
        "{body}"
    );
    // An action: webhook and plugin fields.
    let action = props(&resolve(&doc, body)["properties"]["birth"]);
    for field in [
        "path",
        "url",
        "method",
        "headers",
        "body",
        "plugin",
        "input",
        "retry_count",
    ] {
        assert!(action.contains(field), "action lacks {field}: {action:?}");
    }

    // Every error answer is the spec's error body: {"error": {"code", "message"}}.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, response) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &response["content"]["application/json"]["schema"];
                    assert_eq!(
                        schema["$ref"], "#/components/schemas/ErrorBody",
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    let detail = &doc["components"]["schemas"]["ErrorDetail"];
    let required: Vec<&str> = detail["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["code", "message"]);

    // What each booking route can answer, as the validation table lists it.
    let statuses: BTreeSet<&str> = post["responses"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for status in ["200", "400", "401", "403", "406", "409", "413", "503"] {
        assert!(statuses.contains(status), "POST /schedules lacks {status}");
    }
    // Query parameters of the list, with limit's bounds.
    let params = params_of(&doc["paths"]["/schedules"]["get"]);
    for name in ["state", "resource_id", "from", "to", "limit", "cursor"] {
        assert!(params.contains_key(name), "GET /schedules lacks ?{name}");
    }
    assert_eq!(params["limit"]["schema"]["maximum"], 1000);
    assert!(
        !params.contains_key("X-Kairos-Schedule-Datetime"),
        "a header of /defer, not of the list"
    );
    let defer = params_of(&doc["paths"]["/defer/{path}"]["post"]);
    assert_eq!(defer["X-Kairos-Schedule-Datetime"]["in"], "header");
    assert_eq!(defer["path"]["in"], "path");

    // A plugin's answers say who uses it (the dashboard's plugins page shows it).
    for schema in ["PluginView", "PluginListItem"] {
        let text = doc["components"]["schemas"][schema].to_string();
        for field in ["\"unfinished_lives\"", "\"timers\"", "\"digest\""] {
            assert!(text.contains(field), "{schema} lacks {field}: {text}");
        }
    }
}

fn params_of(op: &Value) -> BTreeMap<String, Value> {
    op["parameters"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| (p["name"].as_str().unwrap().to_string(), p.clone()))
                .collect()
        })
        .unwrap_or_default()
}
