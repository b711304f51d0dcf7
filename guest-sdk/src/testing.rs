//! A test kit: run a plugin's `run` in a native `cargo test`, with no host.
//!
//! On the native target there is no host behind [`http`](crate::http),
//! [`log`](crate::log), [`schedule`](crate::schedule) and [`now_ms`](crate::now_ms):
//! they go to the [`Kit`] the test installs (one per thread, for as long as it lives),
//! which answers requests with the test's handler and records what the plugin did.
//!
//! ```
//! use kairos_guest::testing::{self, Kit};
//! use kairos_guest::{http, Context, Error};
//!
//! fn run(_ctx: Context, url: String) -> Result<u16, Error> {
//!     Ok(http::post_json(&url, &serde_json::json!({"hello": 1}))?.status)
//! }
//!
//! let kit = Kit::new().on_http(|request| {
//!     assert_eq!(request.json()["hello"], 1);
//!     Ok(testing::response(201, "{}"))
//! });
//! assert_eq!(run(testing::context(), "https://api.example.com/x".into()), Ok(201));
//! assert_eq!(kit.requests()[0].url, "https://api.example.com/x");
//! // Or through the JSON the host passes, exactly as a firing would:
//! assert_eq!(testing::call(run, testing::context(), r#""https://a.example/""#), Ok("201".into()));
//! ```

use std::cell::RefCell;
use std::rc::Rc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::http::{HttpError, Response};
use crate::schedule::BookingError;
use crate::{Context, Error, PlanKind};

/// A request the plugin sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentRequest {
    pub method: String,
    pub url: String,
    /// As sent, `content-length` included.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl SentRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Value::Null` when it is none).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A response for a handler to give.
pub fn response(status: u16, body: impl Into<Vec<u8>>) -> Response {
    Response {
        status,
        headers: Vec::new(),
        body: body.into(),
    }
}

/// A firing's context: a first-attempt birth of Life `test-life`, due now.
pub fn context() -> Context {
    Context {
        life_id: "test-life".into(),
        plan: PlanKind::Birth,
        scheduled_at_ms: 1_800_000_000_000,
        attempt: 1,
        resource_id: None,
        plugin_name: "test-plugin".into(),
        plugin_version: 1,
    }
}

/// Calls `run` as the host does: `input` is the booking's JSON input, and the answer is
/// the JSON text the host would record (or the error it would).
pub fn call<I: DeserializeOwned, O: Serialize>(
    run: fn(Context, I) -> Result<O, Error>,
    ctx: Context,
    input: &str,
) -> Result<String, Error> {
    let input: I = serde_json::from_str(input)
        .map_err(|e| Error::fatal(format!("the input does not fit this plugin: {e}")))?;
    let output = crate::http::with_run_key(ctx.idempotency_key(), || run(ctx, input))?;
    serde_json::to_string(&output)
        .map_err(|e| Error::fatal(format!("the output cannot be written as JSON: {e}")))
}

/// The input schema `export_action!(run, input_schema)` declares for `run`, as JSON: the
/// one kairos checks bookings against.
pub fn input_schema<I: DeserializeOwned + schemars::JsonSchema, O: Serialize>(
    run: fn(Context, I) -> Result<O, Error>,
) -> Value {
    serde_json::from_str(&crate::__input_schema(run)).expect("a schema is JSON")
}

type Handler = Box<dyn FnMut(&SentRequest) -> Result<Response, String>>;

#[derive(Default)]
struct State {
    handler: Option<Handler>,
    requests: Vec<SentRequest>,
    logs: Vec<String>,
    bookings: Vec<Value>,
    cancelled: Vec<String>,
    now_ms: Option<i64>,
}

thread_local! {
    static KIT: RefCell<Option<Rc<RefCell<State>>>> = const { RefCell::new(None) };
}

/// The host of a native test: installed on this thread while it lives.
pub struct Kit {
    state: Rc<RefCell<State>>,
}

impl Default for Kit {
    fn default() -> Self {
        Kit::new()
    }
}

impl Kit {
    /// Installs a kit on this thread (replacing one there). Requests fail until
    /// [`on_http`](Kit::on_http) says how to answer them.
    pub fn new() -> Kit {
        let state = Rc::new(RefCell::new(State::default()));
        KIT.with(|k| *k.borrow_mut() = Some(state.clone()));
        Kit { state }
    }

    /// Answers every request with `handler`; an `Err(message)` is a request that got no
    /// response (as a refused or unreachable target).
    pub fn on_http(
        self,
        handler: impl FnMut(&SentRequest) -> Result<Response, String> + 'static,
    ) -> Kit {
        self.state.borrow_mut().handler = Some(Box::new(handler));
        self
    }

    /// What [`now_ms`](crate::now_ms) answers (the machine's clock by default).
    pub fn now_ms(self, ms: i64) -> Kit {
        self.state.borrow_mut().now_ms = Some(ms);
        self
    }

    /// The requests sent so far, in order.
    pub fn requests(&self) -> Vec<SentRequest> {
        self.state.borrow().requests.clone()
    }

    /// The log lines so far, as the run's history shows them (`info: ...`).
    pub fn logs(&self) -> Vec<String> {
        self.state.borrow().logs.clone()
    }

    /// The bodies of the `POST /schedules` the plugin booked (each got the id
    /// `booked-{n}`, from 1).
    pub fn bookings(&self) -> Vec<Value> {
        self.state.borrow().bookings.clone()
    }

    /// The Lives the plugin cancelled.
    pub fn cancelled(&self) -> Vec<String> {
        self.state.borrow().cancelled.clone()
    }
}

impl Drop for Kit {
    fn drop(&mut self) {
        KIT.with(|k| {
            let mut k = k.borrow_mut();
            if k.as_ref().is_some_and(|s| Rc::ptr_eq(s, &self.state)) {
                *k = None;
            }
        });
    }
}

fn with_kit<T>(what: &str, f: impl FnOnce(&mut State) -> T) -> T {
    let state = KIT.with(|k| k.borrow().clone()).unwrap_or_else(|| {
        panic!("kairos_guest: {what} has no host in a native test; create a kairos_guest::testing::Kit first")
    });
    let mut state = state.borrow_mut();
    f(&mut state)
}

pub(crate) fn send(request: SentRequest) -> Result<Response, HttpError> {
    let url = request.url.clone();
    let mut handler = with_kit("http", |s| {
        s.requests.push(request.clone());
        s.handler.take()
    });
    let answer = match handler.as_mut() {
        Some(h) => h(&request),
        None => Err("no HTTP answer given: Kit::on_http(...)".to_string()),
    };
    // Given back after the call, so that a handler may itself look at the kit.
    with_kit("http", |s| s.handler = handler);
    answer.map_err(|e| HttpError::mocked(format!("{url}: {e}")))
}

pub(crate) fn log(level: &str, message: &str) {
    let line = format!("{level}: {message}");
    let kept = KIT.with(|k| {
        k.borrow()
            .as_ref()
            .map(|s| s.borrow_mut().logs.push(line.clone()))
            .is_some()
    });
    if !kept {
        eprintln!("{line}");
    }
}

pub(crate) fn book(request: &Value) -> Result<String, BookingError> {
    with_kit("schedule", |s| {
        s.bookings.push(request.clone());
        Ok(format!("booked-{}", s.bookings.len()))
    })
}

pub(crate) fn cancel(life_id: &str) -> Result<(), BookingError> {
    with_kit("schedule", |s| {
        s.cancelled.push(life_id.to_string());
        Ok(())
    })
}

pub(crate) fn now_ms() -> i64 {
    let fixed = KIT.with(|k| k.borrow().as_ref().and_then(|s| s.borrow().now_ms));
    fixed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{http, log, schedule};

    fn forward(ctx: Context, url: String) -> Result<serde_json::Value, Error> {
        log::info(&format!("run of {}", ctx.life_id));
        let r = http::Request::new("POST", &url)
            .header("idempotency-key", &ctx.life_id)
            .json(&serde_json::json!({"attempt": ctx.attempt}))
            .send()?;
        if !r.is_success() {
            return Err(Error::retryable(format!("answered {}", r.status)));
        }
        let id = schedule::book_point(crate::now_ms() + 60_000, serde_json::json!({"path": "/x"}))?;
        Ok(serde_json::json!({"status": r.status, "next": id}))
    }

    fn post_three(_ctx: Context, url: String) -> Result<u16, Error> {
        http::get(&url)?;
        http::post_json(&url, &serde_json::json!({"n": 1}))?;
        http::Request::new("PUT", &url)
            .header("Idempotency-Key", "mine")
            .send()?;
        Ok(http::Request::new("DELETE", &url).send()?.status)
    }

    #[test]
    fn requests_that_change_something_carry_the_runs_idempotency_keys() {
        let kit = Kit::new().on_http(|_| Ok(response(200, "")));
        let ctx = Context {
            plan: crate::PlanKind::Death,
            ..context()
        };
        call(post_three, ctx.clone(), r#""https://a.example/x""#).unwrap();
        let keys: Vec<Option<String>> = kit
            .requests()
            .iter()
            .map(|r| r.header("idempotency-key").map(str::to_string))
            .collect();
        // GET takes none; the first change takes the webhook's key, the next ones are
        // numbered; a key the plugin set is kept and counts for nothing.
        assert_eq!(
            keys,
            [
                None,
                Some("test-life:death".into()),
                Some("mine".into()),
                Some("test-life:death:2".into())
            ]
        );
        assert_eq!(ctx.idempotency_key(), "test-life:death");
        // A retried run sends the same keys again.
        call(post_three, ctx, r#""https://a.example/x""#).unwrap();
        assert_eq!(
            kit.requests()[5].header("idempotency-key"),
            Some("test-life:death")
        );
    }

    #[test]
    fn a_run_sends_logs_and_books_through_the_kit() {
        let kit = Kit::new().now_ms(1_000).on_http(|r| {
            Ok(response(
                if r.json()["attempt"] == 1 { 200 } else { 503 },
                "",
            ))
        });
        let out = call(forward, context(), r#""https://a.example/hook""#).unwrap();
        assert_eq!(out, r#"{"next":"booked-1","status":200}"#);
        let sent = &kit.requests()[0];
        assert_eq!(
            (sent.method.as_str(), sent.url.as_str()),
            ("POST", "https://a.example/hook")
        );
        assert_eq!(sent.header("Idempotency-Key"), Some("test-life"));
        assert_eq!(sent.header("content-length"), Some("13"));
        assert_eq!(kit.logs(), ["info: run of test-life"]);
        assert_eq!(kit.bookings()[0]["birth_time"], "1970-01-01T00:01:01.000Z");
        // A retry the target refuses is a retryable error, as the host would record it.
        let retry = Context {
            attempt: 2,
            ..context()
        };
        let err = call(forward, retry, r#""https://a.example/hook""#).unwrap_err();
        assert!(err.retryable && err.message.contains("503"), "{err:?}");
        // Input that does not fit is refused before the run, as by the host.
        assert!(call(forward, context(), "42")
            .unwrap_err()
            .message
            .contains("does not fit"));
    }

    #[test]
    fn a_request_without_an_answer_is_an_http_error() {
        let kit = Kit::new();
        let err = http::get("https://a.example/").unwrap_err();
        assert!(err.to_string().contains("no HTTP answer given"), "{err}");
        assert!(!err.is_denied());
        drop(kit);
        let refused = Kit::new().on_http(|_| Err("not allowed".into()));
        assert!(http::get("https://b.example/")
            .unwrap_err()
            .to_string()
            .contains("not allowed"));
        assert_eq!(refused.requests().len(), 1);
    }
}
