//! `GET /openapi.json` (SPEC section 9): an OpenAPI 3.1 document that lists every route
//! the host serves, with its methods, parameters, body schemas and error answers, served
//! without a token (and shown at `/docs`), exact enough for generated clients: every real
//! answer fits it strictly. `scripts/api_fuzz.py` fuzzes the API against it.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::Method;
use kairos_e2e::{fast_flags, Api, Host, RedisServer};
use serde_json::Value;

/// Every route the router serves, with its methods (`/defer/{path}` takes any method;
/// these are the ones documented). A route added to the router without being added here
/// fails `every_route_is_documented`, and one documented but not served fails it too.
const ROUTES: &[(&str, &[&str])] = &[
    ("/schedules", &["get", "post"]),
    ("/schedules/batch", &["post"]),
    ("/failures", &["get"]),
    ("/schedules/{life_uuid}", &["get", "patch", "delete"]),
    ("/defer", &["post"]),
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

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r.clone());
            }
            map.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
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
async fn the_document_and_its_reference_page_need_no_token() {
    let redis = RedisServer::start();
    let host = host(&redis);
    let anon = Api::new(&host);

    // Generators are pointed at the URL: it answers without a token, as the page does;
    // the routes it describes still need one.
    let (status, body) = anon.get("/schedules").await;
    assert_eq!(status, 401, "{body}");
    let (status, page) = anon.text("/docs").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("ui/docs.js") && page.contains("kairos API reference"),
        "{page}"
    );
    let (status, script) = anon.text("/ui/docs.js").await;
    assert_eq!(status, 200);
    assert!(script.contains("fetch('openapi.json')"), "{script}");
    assert!(
        !page.contains("http://") && !page.contains("https://") && !script.contains("https://"),
        "nothing is fetched from elsewhere"
    );
    let (status, headers, doc) = anon
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
    for open in ["/healthz", "/readyz", "/openapi.json"] {
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
    // Every `$ref` names a schema the document holds (a parameter's enum too).
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 50, "{refs:?}");
    let dangling: Vec<&String> = refs
        .iter()
        .filter(|r| {
            r.strip_prefix("#/components/schemas/")
                .is_none_or(|name| doc["components"]["schemas"][name].is_null())
        })
        .collect();
    assert!(dangling.is_empty(), "refs to no schema: {dangling:?}");

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

/// The document's schemas with `additionalProperties: false` put on every object that
/// lists its properties (an `allOf` of objects merged into one first), so that a field
/// an answer has and the document does not fails as surely as one it lacks.
fn strict(doc: &Value) -> Value {
    fn walk(node: &mut Value, schemas: &serde_json::Map<String, Value>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::Array(parts)) = map.get("allOf").cloned() {
                    let mut properties = serde_json::Map::new();
                    let mut required = Vec::new();
                    for part in parts {
                        let part = match part["$ref"].as_str() {
                            Some(r) => {
                                schemas[r.trim_start_matches("#/components/schemas/")].clone()
                            }
                            None => part,
                        };
                        if let Some(p) = part["properties"].as_object() {
                            properties.extend(p.clone());
                        }
                        if let Some(r) = part["required"].as_array() {
                            required.extend(r.iter().cloned());
                        }
                    }
                    map.remove("allOf");
                    map.insert("type".into(), "object".into());
                    map.insert("properties".into(), Value::Object(properties));
                    map.insert("required".into(), Value::Array(required));
                }
                if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                    map.insert("additionalProperties".into(), false.into());
                }
                for value in map.values_mut() {
                    walk(value, schemas);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, schemas)),
            _ => {}
        }
    }
    let mut doc = doc.clone();
    let schemas = doc["components"]["schemas"].as_object().unwrap().clone();
    walk(&mut doc, &schemas);
    doc
}

/// Every answer of a scenario that calls every route (bookings point, term, plugin,
/// debounced and in a batch; /defer both ways; timers; push and pull queues with tasks
/// one at a time, in a list and in `{"tasks"}`; plugins; the clock; refusals) is checked
/// against the schema the document gives for its route and status, made strict: a
/// status the document does not list for the route, or a body that does not fit, fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_real_answer_fits_the_document_strictly() {
    use serde_json::json;
    let redis = RedisServer::start();
    let sink = kairos_e2e::Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &kairos_e2e::flags(&sink, &[("--clock", "manual")]),
    );
    let api = Api::new(&host);
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, 200);
    let strict = strict(&doc);
    let mut checked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut problems = Vec::new();
    let mut check = |method: &str, template: &str, status: u16, body: &Value| {
        checked.insert((template.to_string(), method.to_string()));
        let response = &strict["paths"][template][method]["responses"][status.to_string()];
        if response.is_null() {
            problems.push(format!(
                "{method} {template} answered {status}, which the document does not list: {body}"
            ));
            return;
        }
        let schema = &response["content"]["application/json"]["schema"];
        if schema.is_null() {
            return;
        }
        let mut root = schema.clone();
        root["components"] = strict["components"].clone();
        let validator = jsonschema::draft202012::new(&root).unwrap_or_else(|e| {
            panic!("{method} {template} {status}: a schema that does not compile: {e}")
        });
        for error in validator.iter_errors(body) {
            problems.push(format!(
                "{method} {template} {status}: at {}: {error}",
                error.instance_path()
            ));
        }
    };
    macro_rules! call {
        ($method:literal, $template:literal, $path:expr, $body:expr) => {{
            let (status, reply) = api
                .raw(
                    Method::from_bytes($method.to_ascii_uppercase().as_bytes()).unwrap(),
                    &$path,
                    serde_json::to_vec(&$body).unwrap(),
                    &[],
                )
                .await;
            check($method, $template, status, &reply);
            (status, reply)
        }};
        ($method:literal, $template:literal, $path:expr) => {{
            let (status, reply) = api
                .raw(
                    Method::from_bytes($method.to_ascii_uppercase().as_bytes()).unwrap(),
                    &$path,
                    Vec::new(),
                    &[],
                )
                .await;
            check($method, $template, status, &reply);
            (status, reply)
        }};
    }

    call!("get", "/healthz", "/healthz");
    call!("get", "/readyz", "/readyz");
    let (_, clock) = call!("get", "/clock", "/clock");
    let now = clock["now_ms"].as_i64().unwrap();
    let at = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(now + ms)
            .unwrap()
            .to_rfc3339()
    };
    let (status, _, meta) = api
        .call(
            Method::PUT,
            "/plugins/p1",
            kairos_e2e::plugin_wasm("noop"),
            &[("content-type", "application/wasm")],
        )
        .await;
    assert_eq!(status, 201, "{meta}");
    check("put", "/plugins/{name}", status, &meta);
    call!("get", "/plugins", "/plugins");
    call!("get", "/plugins/{name}", "/plugins/p1");

    let hook = json!({"path": "/hook", "method": "POST", "body": "text",
        "headers": {"x-a": "1"}, "retry_count": 2, "retry_interval": "1s",
        "on_success": {"path": "/done", "method": "POST"},
        "on_failure": {"url": "https://example.com/failed", "method": "PUT"}});
    let (s, r) = call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"life_uuid": "pt", "birth_time": at(60_000), "birth": hook})
    );
    assert_eq!(s, 200, "{r}");
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"life_uuid": "tm", "schedule_type": "term", "resource_id": "r1",
        "term": {"birth_time": at(120_000), "death_time": at(600_000)},
        "birth": {"path": "/on", "method": "POST", "body": [1, "two", null]},
        "death_action": {"path": "/off", "method": "DELETE", "body": {"id": "a0"}}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"life_uuid": "pl", "birth_time": at(60_000),
        "birth": {"plugin": "p1", "input": ["any", 1], "timeout": 5}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"birth": {"path": "/d", "method": "GET"},
        "debounce": {"key": "k", "period": "1m", "max_wait": "5m"}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"birth": {"path": "/d", "method": "GET"},
        "debounce": {"key": "k", "period": 60}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"birth_time": "yesterday", "birth": {"path": "/d", "method": "GET"}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"life_uuid": "pt", "birth_time": at(60_000), "birth": {"path": "/d", "method": "GET"}})
    );
    call!(
        "post",
        "/schedules",
        "/schedules",
        json!({"birth_time": at(10), "birth": {"path": "/d", "method": "GET"}})
    );
    call!(
        "post",
        "/schedules/batch",
        "/schedules/batch",
        json!({"bookings": [
        {"birth_time": at(60_000), "birth": {"path": "/b", "method": "POST"}},
        {"birth_time": at(60_000), "birth": {"path": "/b"}}]})
    );
    call!("post", "/schedules/batch", "/schedules/batch", json!([]));
    call!(
        "post",
        "/defer",
        "/defer",
        json!({"path": "/later", "body": {"x": 1}, "at": at(60_000)})
    );
    call!("post", "/defer", "/defer", json!({"path": "/later"}));
    let (s, r) = api
        .raw(
            Method::PUT,
            "/defer/x/y?z=1",
            b"raw".to_vec(),
            &[("x-kairos-schedule-datetime", &at(60_000))],
        )
        .await;
    check("put", "/defer/{path}", s, &r);
    let (s, r) = api
        .raw(
            Method::POST,
            "/defer/x%2Fy",
            Vec::new(),
            &[("x-kairos-schedule-datetime", &at(60_000))],
        )
        .await;
    check("post", "/defer/{path}", s, &r);
    call!("get", "/schedules", "/schedules?limit=2");
    call!("get", "/schedules", "/schedules?state=Alive&resource_id=r1");
    call!("get", "/schedules", "/schedules?state=alive");
    call!("get", "/schedules/{life_uuid}", "/schedules/tm");
    call!("get", "/schedules/{life_uuid}", "/schedules/nope");
    call!(
        "patch",
        "/schedules/{life_uuid}",
        "/schedules/tm",
        json!({"term": {"death_time": at(700_000)}})
    );
    call!(
        "patch",
        "/schedules/{life_uuid}",
        "/schedules/tm",
        json!({"nope": 1})
    );

    let timer = json!({"name": "t1", "schedule": "*/5 * * * *", "timezone": "Europe/Paris",
        "action": {"path": "/tick", "method": "POST", "body": {"n": 1}}, "priority": 2, "timeout": "10s",
        "retries": 1, "misfire": "fire_all", "catch_up_limit": 3, "catch_up_window": "1h",
        "overlap": "cancel_running", "starting_deadline": 30, "exclude_dates": ["2031-12-25"],
        "dst": {"repeated": "once", "gap": "skip"}});
    call!("post", "/timers", "/timers", timer);
    call!("post", "/timers", "/timers", timer);
    call!(
        "post",
        "/timers",
        "/timers",
        json!({"name": "t2", "schedule": "02:00 10:00",
        "action": {"plugin": "p1", "input": "x"}})
    );
    call!("get", "/timers", "/timers");
    call!("get", "/timers/{name}", "/timers/t1?preview=3");
    call!(
        "patch",
        "/timers/{name}",
        "/timers/t1",
        json!({"schedule": "*/10 * * * *", "overlap": "buffer_one"})
    );
    call!(
        "post",
        "/timers/validate",
        "/timers/validate",
        json!({"schedule": "0 9 * * 1-5", "preview": 2})
    );
    call!(
        "post",
        "/timers/validate",
        "/timers/validate",
        json!({"schedule": "61 * * * *"})
    );
    call!("post", "/timers/{name}/deactivate", "/timers/t2/deactivate");
    call!("post", "/timers/{name}/activate", "/timers/t2/activate");
    call!("post", "/timers/{name}/run", "/timers/t1/run");

    call!(
        "put",
        "/queues/{name}",
        "/queues/q",
        json!({"rate": 5, "bucket_size": 2, "max_concurrent": 3,
        "key": "/customer", "max_concurrent_per_key": 1, "rate_per_key": 1.5,
        "retry": {"limit": 3, "age_limit": "1h", "min_backoff": 1, "max_backoff": "1m", "max_doublings": 2}})
    );
    call!(
        "put",
        "/queues/{name}",
        "/queues/pq",
        json!({"mode": "pull"})
    );
    call!("get", "/queues", "/queues");
    call!("get", "/queues/{name}", "/queues/q");
    call!("get", "/queues/{name}", "/queues/pq");
    let task = |name: &str| {
        json!({"name": name, "countdown": 3600, "expire_after": "1h",
        "action": {"path": "/task", "method": "POST", "body": {"customer": "c1"}}})
    };
    call!(
        "post",
        "/queues/{name}/tasks",
        "/queues/q/tasks",
        task("one")
    );
    call!(
        "post",
        "/queues/{name}/tasks",
        "/queues/q/tasks",
        json!([task("two"), task("three")])
    );
    call!(
        "post",
        "/queues/{name}/tasks",
        "/queues/q/tasks",
        json!({"tasks": [task("four")]})
    );
    call!(
        "post",
        "/queues/{name}/tasks",
        "/queues/q/tasks",
        task("one")
    );
    call!("get", "/queues/{name}/tasks", "/queues/q/tasks");
    call!("get", "/queues/{name}/tasks/{task}", "/queues/q/tasks/two");
    call!(
        "post",
        "/queues/{name}/tasks/{task}/run",
        "/queues/q/tasks/three/run"
    );
    call!(
        "delete",
        "/queues/{name}/tasks/{task}",
        "/queues/q/tasks/four"
    );
    call!("post", "/queues/{name}/pause", "/queues/q/pause");
    call!("post", "/queues/{name}/resume", "/queues/q/resume");
    call!("get", "/queues/{name}/failed", "/queues/q/failed");
    for (i, payload) in [json!({"a": 1}), json!("text"), json!([1, 2]), json!(null)]
        .into_iter()
        .enumerate()
    {
        call!(
            "post",
            "/queues/{name}/tasks",
            "/queues/pq/tasks",
            json!({"name": format!("p{i}"), "payload": payload, "tag": "t"})
        );
    }
    let (_, leased) = call!(
        "post",
        "/queues/{name}/lease",
        "/queues/pq/lease",
        json!({"count": 3, "lease_seconds": 30, "tag": "t"})
    );
    let lease = |i: usize| {
        (
            leased["tasks"][i]["name"]
                .as_str()
                .unwrap_or("none")
                .to_string(),
            leased["tasks"][i]["lease_id"]
                .as_str()
                .unwrap_or("none")
                .to_string(),
        )
    };
    let (name, id) = lease(0);
    call!(
        "post",
        "/queues/{name}/tasks/{task}/ack",
        format!("/queues/pq/tasks/{name}/ack"),
        json!({"lease_id": id})
    );
    let (name, id) = lease(1);
    call!(
        "post",
        "/queues/{name}/tasks/{task}/extend",
        format!("/queues/pq/tasks/{name}/extend"),
        json!({"lease_id": id, "lease_seconds": 60})
    );
    call!(
        "get",
        "/queues/{name}/tasks/{task}",
        format!("/queues/pq/tasks/{name}")
    );
    let (name, id) = lease(2);
    call!(
        "post",
        "/queues/{name}/tasks/{task}/nack",
        format!("/queues/pq/tasks/{name}/nack"),
        json!({"lease_id": id})
    );
    call!(
        "post",
        "/queues/{name}/tasks/{task}/nack",
        format!("/queues/pq/tasks/{name}/nack"),
        json!({"lease_id": "stale"})
    );
    call!("get", "/queues/{name}/tasks", "/queues/pq/tasks");

    // Time passes: births, the timer's slots and the due task run against the sink.
    call!("post", "/clock", "/clock", json!({"advance": "15m"}));
    call!("get", "/schedules/{life_uuid}", "/schedules/pt");
    call!("get", "/schedules/{life_uuid}", "/schedules/pl");
    call!("get", "/schedules/{life_uuid}", "/schedules/tm");
    call!("get", "/timers/{name}/runs", "/timers/t1/runs");
    call!("get", "/timers/{name}", "/timers/t1");
    call!("get", "/queues/{name}/tasks", "/queues/q/tasks");
    call!("get", "/queues/{name}", "/queues/q");
    call!("delete", "/schedules/{life_uuid}", "/schedules/tm");
    call!("delete", "/schedules/{life_uuid}", "/schedules/nope");
    call!("post", "/queues/{name}/purge", "/queues/q/purge");
    call!("delete", "/queues/{name}", "/queues/pq");
    call!("delete", "/timers/{name}", "/timers/t2");
    call!("delete", "/timers/{name}", "/timers/t2");
    call!("delete", "/plugins/{name}", "/plugins/p1");
    call!(
        "delete",
        "/schedules/{life_uuid}",
        "/schedules/pl?force=true"
    );
    call!("delete", "/plugins/{name}", "/plugins/p1");
    // Finished Lives with their outcomes, both ways, and the failures.
    call!("get", "/schedules", "/schedules?order=desc&limit=5");
    call!("get", "/schedules", "/schedules?outcome=cancelled");
    call!("get", "/schedules", "/schedules?outcome=nope");
    call!("get", "/failures", "/failures");
    call!("get", "/failures", "/failures?outcome=birth_failed&limit=2");
    call!("get", "/failures", "/failures?outcome=cancelled");

    assert!(
        problems.is_empty(),
        "{} answers do not fit the document:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // Every documented JSON route was called (the text ones are /metrics and the document).
    let missing: Vec<String> = ROUTES
        .iter()
        .flat_map(|(path, methods)| {
            methods
                .iter()
                .map(move |m| (path.to_string(), m.to_string()))
        })
        .filter(|(p, m)| !checked.contains(&(p.clone(), m.clone())))
        .filter(|(p, _)| p != "/metrics" && p != "/openapi.json")
        .filter(|(p, m)| p != "/defer/{path}" || m == "put" || m == "post")
        .map(|(p, m)| format!("{m} {p}"))
        .collect();
    assert!(
        missing.is_empty(),
        "routes the scenario did not call: {missing:?}"
    );
}

/// What generated clients need typed: free-form JSON as any JSON (`{}`), callbacks and
/// the actions, retry blocks, buckets and counts of answers as named schemas, closed
/// vocabularies as enums, creation and change as schemas of their own (what creation
/// needs required), bulk tasks as one of three shapes with a typed answer, one naming of
/// run times, and descriptions that speak of the API only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_types_what_clients_send_and_receive() {
    use serde_json::json;
    let redis = RedisServer::start();
    let host = host(&redis);
    let (status, doc) = Api::new(&host).get("/openapi.json").await;
    assert_eq!(status, 200);
    let schemas = &doc["components"]["schemas"];
    let prop = |schema: &str, field: &str| schemas[schema]["properties"][field].clone();
    // Any JSON: no type at all (an optional one is not wrapped in oneOf with null).
    for (schema, field) in [
        ("Action", "body"),
        ("Action", "input"),
        ("TaskBody", "payload"),
        ("LeasedTask", "payload"),
        ("ActionView", "body"),
        ("DeferBody", "body"),
        ("RunRecord", "output"),
    ] {
        let p = prop(schema, field);
        assert!(p.is_object(), "{schema}.{field} missing");
        assert!(
            p.get("type").is_none() && p.get("oneOf").is_none() && p.get("$ref").is_none(),
            "{schema}.{field} is not any JSON: {p}"
        );
    }
    assert!(schemas.get("AnyJson").is_none());
    // Named schemas where answers and callbacks were bare objects.
    let refers = |p: &Value, to: &str| {
        let text = p.to_string();
        text.contains(&format!("\"#/components/schemas/{to}\""))
    };
    for (schema, field, to) in [
        ("Action", "on_success", "Action"),
        ("Action", "on_failure", "Action"),
        ("PlanView", "action", "ActionView"),
        ("TimerView", "action", "ActionView"),
        ("TaskView", "action", "ActionView"),
        ("QueueView", "retry", "RetryView"),
        ("QueueView", "bucket", "BucketView"),
        ("QueueView", "tasks", "TaskCounts"),
        ("LifeSummary", "debounce", "DebounceView"),
        ("TimerView", "dst", "DstView"),
        ("BookingCreate", "schedule_type", "ScheduleType"),
        ("Booked", "state", "LifeState"),
        ("PlanView", "state", "PlanState"),
        ("Action", "method", "HttpMethod"),
        ("TimerCreate", "misfire", "Misfire"),
        ("TimerView", "overlap", "Overlap"),
        ("QueueView", "mode", "QueueMode"),
        ("RunRecord", "outcome", "RunOutcome"),
        ("TimerRunRecord", "outcome", "RunOutcome"),
    ] {
        assert!(
            refers(&prop(schema, field), to),
            "{schema}.{field} is not {to}: {}",
            prop(schema, field)
        );
    }
    let enum_of = |name: &str| schemas[name]["enum"].clone();
    assert_eq!(enum_of("ScheduleType"), json!(["point", "term"]));
    assert_eq!(
        enum_of("LifeState"),
        json!(["Inexistent", "Alive", "Dead", "Stillbirth", "Invalidated"])
    );
    assert_eq!(
        enum_of("PlanState"),
        json!([
            "Standby",
            "Preset",
            "Running",
            "Done",
            "Failed",
            "Invalidated",
            "Cancelled"
        ])
    );
    assert_eq!(
        enum_of("Overlap"),
        json!(["skip", "buffer_one", "cancel_running"])
    );
    assert!(schemas["Overlap"]["description"]
        .as_str()
        .unwrap()
        .contains("cancel_running"));
    assert_eq!(enum_of("Misfire"), json!(["skip", "fire_once", "fire_all"]));
    assert_eq!(enum_of("QueueMode"), json!(["push", "pull"]));
    assert_eq!(
        enum_of("HttpMethod"),
        json!(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    );
    assert_eq!(enum_of("DstRepeated"), json!(["once", "twice"]));
    assert_eq!(enum_of("DstGap"), json!(["after_gap", "skip"]));
    let state_param = params_of(&doc["paths"]["/schedules"]["get"])["state"].clone();
    assert!(refers(&state_param, "LifeState"), "{state_param}");
    // The fields the server sends are there.
    let keys = |schema: &str| -> BTreeSet<String> {
        schemas[schema]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    for field in [
        "misfire",
        "overlap",
        "dst",
        "exclude_dates",
        "catch_up_limit",
        "catch_up_window",
        "starting_deadline",
    ] {
        assert!(keys("TimerView").contains(field), "TimerView lacks {field}");
    }
    for field in ["key", "max_concurrent_per_key", "rate_per_key"] {
        assert!(keys("QueueView").contains(field), "QueueView lacks {field}");
    }
    // Creation and change: their own schemas; creation requires what it needs.
    let body_ref = |path: &str, method: &str| {
        doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("#/components/schemas/")
            .to_string()
    };
    assert_eq!(body_ref("/schedules", "post"), "BookingCreate");
    assert_eq!(body_ref("/schedules/{life_uuid}", "patch"), "BookingChange");
    assert_eq!(body_ref("/timers", "post"), "TimerCreate");
    assert_eq!(body_ref("/timers/{name}", "patch"), "TimerChange");
    assert_eq!(body_ref("/defer", "post"), "DeferBody");
    assert_eq!(body_ref("/schedules/batch", "post"), "BatchRequest");
    let required = |schema: &str| -> BTreeSet<String> {
        schemas[schema]["required"]
            .as_array()
            .map(|r| r.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        required("TimerCreate"),
        ["action", "name", "schedule"].map(String::from).into()
    );
    assert!(required("TimerChange").is_empty());
    assert_eq!(
        required("DeferBody"),
        ["at", "path"].map(String::from).into()
    );
    let mut created = keys("TimerCreate");
    created.remove("name");
    assert_eq!(
        keys("TimerChange"),
        created,
        "a change takes every field but the name"
    );
    let mut booked = keys("BookingCreate");
    booked.remove("life_uuid");
    booked.remove("debounce");
    assert_eq!(
        keys("BookingChange"),
        booked,
        "a change takes every field but the id and debounce"
    );
    for schema in [
        "BookingCreate",
        "BookingChange",
        "TimerCreate",
        "DeferBody",
        "Action",
        "TaskBody",
    ] {
        assert_eq!(
            schemas[schema]["additionalProperties"], false,
            "{schema} refuses unknown fields"
        );
    }
    // Bulk tasks: one, a list, or {"tasks": [...]}; the answer typed to match.
    let tasks_body = &doc["paths"]["/queues/{name}/tasks"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    assert!(refers(tasks_body, "NewTasks"), "{tasks_body}");
    let shapes = schemas["NewTasks"]["oneOf"].as_array().unwrap();
    assert_eq!(shapes.len(), 3, "{shapes:?}");
    assert!(
        refers(&shapes[0], "TaskBody")
            && shapes[1]["type"] == "array"
            && refers(&shapes[2], "NewTaskList")
    );
    let answer = &doc["paths"]["/queues/{name}/tasks"]["post"]["responses"]["200"]["content"]
        ["application/json"]["schema"];
    assert!(refers(answer, "TasksAddedAnswer"));
    assert_eq!(
        schemas["TasksAddedAnswer"]["oneOf"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // One naming of run times: text under the name, epoch ms under `_ms`.
    for schema in ["RunRecord", "TimerRunRecord"] {
        let text = prop(schema, "should_run_at").to_string();
        assert!(
            text.contains("string") && !text.contains("integer"),
            "{schema}: {text}"
        );
        assert!(
            prop(schema, "should_run_at_ms")
                .to_string()
                .contains("integer"),
            "{schema}"
        );
        assert!(prop(schema, "should_run_at_time").is_null(), "{schema}");
    }
    // Descriptions speak of the API only: no spec sections, no Rust paths.
    let mut texts = Vec::new();
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    if (k == "description" || k == "summary") && v.is_string() {
                        out.push(v.as_str().unwrap().to_string());
                    }
                    collect(v, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&doc, &mut texts);
    assert!(texts.len() > 100, "{}", texts.len());
    for text in &texts {
        for word in [
            "SPEC",
            "::",
            "deny_unknown_fields",
            "serde",
            "_json`",
            "(`store",
        ] {
            assert!(
                !text.contains(word),
                "a description mentions `{word}`: {text}"
            );
        }
    }
}
