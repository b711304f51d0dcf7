//! The three guest SDKs agree (issue 27): the same plugin written with the Rust,
//! JavaScript and Python SDKs (`plugins/http-forward`, `js-forward`, `python-forward`:
//! one request described by its input, the SDK's error propagated, a 408, 429 or 5xx
//! answer a retryable error) meets the same trouble, both under `kairos plugins run` and
//! fired by a host, and every case gives the same outcome, retryable flag and error
//! text: a refused host, a connect error, a timeout, a 5xx, a 429 with Retry-After, an
//! invalid URL. Real components, a real host and Redis, real HTTP on loopback.

use std::process::Command;
use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

/// The outbound request timeout of both contexts; the slow target answers well after it.
const REQUEST_TIMEOUT: &str = "4s";

/// The two tests run one at a time: each compiles three components (13–19 MB for
/// JavaScript and Python) or fires eighteen plugin runs at once, and on two cores the
/// other's load made a 503 answered at once take past the request timeout to be seen.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A guest SDK and its forward plugin.
struct Sdk {
    lang: &'static str,
    wasm: fn() -> Vec<u8>,
}

fn sdks() -> [Sdk; 3] {
    [
        Sdk {
            lang: "rust",
            wasm: || plugin_wasm("http-forward"),
        },
        Sdk {
            lang: "js",
            wasm: || js_plugin_wasm("forward"),
        },
        Sdk {
            lang: "python",
            wasm: || python_plugin_wasm("forward"),
        },
    ]
}

/// Where each context says a refused host is allowed.
const UPLOAD_KNOB: &str = "given at upload: `kairos plugins upload --allowed-hosts host:port`, or PUT /plugins/{name}?allowed_hosts=host:port";
const RUN_KNOB: &str = "given to `kairos plugins run` with --allow host:port";

/// One kind of trouble: the URL the plugin is given, and what every SDK must make of it
/// (`knob`: where the context says the refused host is allowed).
struct Case {
    name: &'static str,
    url: String,
    retryable: bool,
    error: fn(&str, &str) -> String,
}

/// The targets of the cases: what answers 503, what answers 429 with Retry-After, what
/// answers too late, a port nobody listens on, and a sink the plugins may not call.
struct Targets {
    busy: Sink,
    limited: Sink,
    slow: Sink,
    closed: u16,
    forbidden: Sink,
}

impl Targets {
    async fn start() -> Targets {
        let busy = Sink::start().await;
        busy.answer_paths(&[("/busy", 503)]);
        let limited = Sink::start().await;
        limited.answer_paths(&[("/limited", 429)]);
        limited.set_retry_after(Some("1"));
        let slow = Sink::start().await;
        // Past the request timeout both contexts are given (REQUEST_TIMEOUT: on a busy
        // 2-core machine a debug build once took 3.3 s to see a 503 answered at once).
        slow.set_delay(Duration::from_millis(8_000));
        Targets {
            busy,
            limited,
            slow,
            closed: free_port(),
            forbidden: Sink::start().await,
        }
    }

    /// The hosts the plugins may call: all but `forbidden`.
    fn allowed(&self) -> String {
        [
            self.busy.addr.port(),
            self.limited.addr.port(),
            self.slow.addr.port(),
            self.closed,
        ]
        .map(|port| format!("127.0.0.1:{port}"))
        .join(",")
    }

    fn cases(&self) -> Vec<Case> {
        vec![
            Case {
                name: "refused host",
                url: format!("{}/x", self.forbidden.base_url()),
                retryable: false,
                error: |url, knob| {
                    format!(
                        "{url}: the request was denied by the outbound policy (denied: {url} is not in this plugin's allowed_hosts ({knob}))"
                    )
                },
            },
            Case {
                name: "connect error",
                url: format!("http://127.0.0.1:{}/x", self.closed),
                retryable: true,
                error: |url, _| format!("{url}: ConnectionRefused"),
            },
            Case {
                name: "timeout",
                url: format!("{}/slow", self.slow.base_url()),
                retryable: true,
                error: |url, _| format!("{url}: HttpResponseTimeout"),
            },
            Case {
                name: "5xx",
                url: format!("{}/busy", self.busy.base_url()),
                retryable: true,
                error: |url, _| format!("{url} answered 503"),
            },
            Case {
                name: "429 with Retry-After",
                url: format!("{}/limited", self.limited.base_url()),
                retryable: true,
                error: |url, _| format!("{url} answered 429"),
            },
            Case {
                name: "invalid URL",
                url: format!("ftp://127.0.0.1:{}/x", self.closed),
                retryable: false,
                error: |url, _| {
                    format!("{url}: only absolute http:// and https:// URLs are supported")
                },
            },
        ]
    }
}

/// The plugins' input for `url`: a body of 32 KiB, more than the host's body channel
/// holds, so that a request that ends early (refused, not connected) always finds the
/// body stream closed while it is written, whatever the timing.
fn input(url: &str) -> Value {
    json!({"url": url, "body": {"pad": "x".repeat(32 * 1024)}})
}

/// What became of one run: its error without the `plugin {name}: ` the host puts before
/// it, and whether it would be retried.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    error: String,
    retryable: bool,
}

fn without_plugin(error: &str, name: &str) -> String {
    error
        .strip_prefix(&format!("plugin {name}: "))
        .unwrap_or_else(|| panic!("`{error}` does not start with `plugin {name}: `"))
        .to_string()
}

/// `kairos plugins run FILE --input INPUT --allow ALLOWED --request-timeout REQUEST_TIMEOUT`, with
/// compiled code kept in a cache under target/ (a second run loads it).
fn plugins_run(file: &std::path::Path, input: &Value, allowed: &str) -> Outcome {
    let out = Command::new(kairos_bin())
        .args([
            "--server",
            "http://127.0.0.1:9",
            "-o",
            "json",
            "plugins",
            "run",
        ])
        .arg(file)
        .args(["--input", &input.to_string(), "--allow", allowed])
        .args(["--request-timeout", REQUEST_TIMEOUT, "--timeout", "10s"])
        .env("XDG_CACHE_HOME", shared_data_dir().join("xdg-cache"))
        .output()
        .expect("kairos runs");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(1), "the run must fail: {json:#}");
    assert_eq!(json["ok"], false, "{json:#}");
    let name = file
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .replace('_', "-");
    Outcome {
        error: without_plugin(json["error"].as_str().unwrap(), &name),
        retryable: json["retryable"].as_bool().unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sdk_gives_the_same_outcome_for_the_same_trouble_under_plugins_run() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let targets = Targets::start().await;
    let dir = TempDir::new("sdk-conformance");
    let allowed = targets.allowed();
    let cases = targets.cases();
    for sdk in sdks() {
        let file = dir.0.join(format!("conf_{}.wasm", sdk.lang));
        std::fs::write(&file, (sdk.wasm)()).unwrap();
        for case in &cases {
            // The refused host three times: it once depended on timing.
            let tries = if case.name == "refused host" { 3 } else { 1 };
            for _ in 0..tries {
                let file = file.clone();
                let (input, allowed) = (input(&case.url), allowed.clone());
                let got = tokio::task::spawn_blocking(move || plugins_run(&file, &input, &allowed))
                    .await
                    .unwrap();
                let want = Outcome {
                    error: (case.error)(&case.url, RUN_KNOB),
                    retryable: case.retryable,
                };
                assert_eq!(
                    got, want,
                    "{} SDK, {}, under plugins run",
                    sdk.lang, case.name
                );
            }
        }
    }
    assert!(
        targets.forbidden.received().is_empty(),
        "a refused request was sent"
    );
    assert!(!targets.busy.received().is_empty() && !targets.limited.received().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sdk_gives_the_same_outcome_for_the_same_trouble_when_fired() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let targets = Targets::start().await;
    let redis = RedisServer::start();
    // The host's list and each plugin's name the same targets.
    let allowed = targets.allowed();
    let host = Host::start(
        &redis.url(),
        &flags(
            &targets.busy,
            &[
                ("--request-timeout", REQUEST_TIMEOUT),
                ("--allowed-hosts", &allowed),
            ],
        ),
    );
    let api = Api::new(&host);
    let query = format!("allowed_hosts={allowed}&timeout=10s");
    let cases = targets.cases();
    let sdks = sdks();
    for sdk in &sdks {
        upload_component(&api, &format!("conf-{}", sdk.lang), (sdk.wasm)(), &query).await;
    }
    // Every case for every SDK, one retry allowed: a retryable error runs twice (the
    // first run's outcome `retry`), a final one once (`failed`).
    let at = now_ms() + 1_500;
    let mut lives = Vec::new();
    for (s, sdk) in sdks.iter().enumerate() {
        for (c, case) in cases.iter().enumerate() {
            let id = format!("7f000000-0000-4000-8000-00000000c{s}{c:02}");
            let action = json!({
                "plugin": format!("conf-{}", sdk.lang),
                "input": input(&case.url),
                "retry_count": 1,
                "retry_interval": "200ms",
            });
            book(&api, &point(&id, at, action)).await;
            lives.push((id, sdk, case));
        }
    }
    for (id, sdk, case) in &lives {
        let life = api
            .wait_life(id, Duration::from_secs(60), |l| {
                matches!(state(l), "Dead" | "Stillbirth" | "Invalidated")
            })
            .await;
        let what = format!("{} SDK, {}, fired", sdk.lang, case.name);
        assert_eq!(state(&life), "Stillbirth", "{what}: {life:#}");
        let mut runs = history(&life);
        runs.sort_by_key(|r| r["started_at_ms"].as_i64().unwrap());
        assert_eq!(
            runs.len(),
            if case.retryable { 2 } else { 1 },
            "{what}: {runs:#?}"
        );
        let first = &runs[0];
        let got = Outcome {
            error: without_plugin(
                first["error"].as_str().unwrap(),
                &format!("conf-{}", sdk.lang),
            ),
            retryable: first["outcome"] == "retry",
        };
        let want = Outcome {
            error: (case.error)(&case.url, UPLOAD_KNOB),
            retryable: case.retryable,
        };
        assert_eq!(got, want, "{what}: {first:#}");
        if case.retryable {
            assert_eq!(runs[1]["outcome"], "failed", "{what}: {runs:#?}");
        }
    }
    assert!(
        targets.forbidden.received().is_empty(),
        "a refused request was sent"
    );
}
