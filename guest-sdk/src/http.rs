//! An HTTP client over `wasi:http/outgoing-handler`, the plugin's only way out.
//!
//! ```ignore
//! let r = http::get("https://api.example.com/status")?;
//! let r = http::post_json("https://hooks.example.com/x", &serde_json::json!({"a": 1}))?;
//! let r = http::Request::new("PUT", "https://api.example.com/items/7")
//!     .header("authorization", "Bearer ...")
//!     .json(&item)
//!     .send()?;
//! if r.is_success() { let v: Item = r.json()?; }
//! ```
//!
//! Every request passes the host's outbound policy and the plugin's `allowed_hosts`; a
//! refused one fails with an [`HttpError`] whose [`HttpError::is_denied`] is true. What
//! becomes of an error that escapes `run` ([`HttpError::is_retryable`]): a request that
//! got no answer (a connect error, a timeout) is retried; one the host refused, or one
//! that could not be made (a URL that is not absolute `http://` or `https://`, an
//! invalid header), fails the Plan at once. The Rust, JavaScript and Python SDKs give
//! the same error, with the same text, in each of these cases.
//!
//! A request that may change something (any method but GET, HEAD, OPTIONS and TRACE)
//! carries an `Idempotency-Key` unless the plugin set one: the run's
//! [`Context::idempotency_key`](crate::Context::idempotency_key) for the first such
//! request of the run, then `{key}:2`, `{key}:3`, … for the next ones. A retried run
//! that makes the same requests in the same order sends the same keys, so a target that
//! de-duplicates on the header does each only once; two different requests of one run
//! never share a key.

use std::cell::RefCell;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::bindings::wasi::http::types::Scheme;
#[cfg(target_family = "wasm")]
use crate::bindings::wasi::http::{
    outgoing_handler,
    types::{
        http_error_code, ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest,
    },
};
#[cfg(target_family = "wasm")]
use crate::bindings::wasi::io::streams::StreamError;

thread_local! {
    /// The run under way: its idempotency key and how many requests took one so far.
    static RUN_KEY: RefCell<Option<(String, u32)>> = const { RefCell::new(None) };
}

/// Runs `f` as a run whose requests derive their `Idempotency-Key` from `key`.
pub(crate) fn with_run_key<T>(key: String, f: impl FnOnce() -> T) -> T {
    RUN_KEY.with_borrow_mut(|k| *k = Some((key, 0)));
    let out = f();
    RUN_KEY.with_borrow_mut(|k| *k = None);
    out
}

/// The next request's `Idempotency-Key` in the run under way (None outside a run).
fn next_idempotency_key() -> Option<String> {
    RUN_KEY.with_borrow_mut(|k| {
        k.as_mut().map(|(base, n)| {
            *n += 1;
            if *n == 1 {
                base.clone()
            } else {
                format!("{base}:{n}")
            }
        })
    })
}

/// Largest chunk handed to the output stream in one write (wasi:io allows 4 KiB).
#[cfg(target_family = "wasm")]
const WRITE_CHUNK: usize = 4096;
/// Most bytes asked of the input stream in one read.
#[cfg(target_family = "wasm")]
const READ_CHUNK: u64 = 64 * 1024;

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    message: String,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No answer came (connect error, timeout, the connection dropped): may pass.
    Transport,
    /// The host's outbound policy or the plugin's `allowed_hosts` refused it.
    Denied,
    /// The request could not be made as given (URL, method, header).
    Invalid,
}

impl HttpError {
    fn new(message: impl Into<String>) -> Self {
        HttpError {
            message: message.into(),
            kind: Kind::Transport,
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        HttpError {
            message: message.into(),
            kind: Kind::Invalid,
        }
    }

    #[cfg(target_family = "wasm")]
    fn from_code(url: &str, code: ErrorCode) -> Self {
        if matches!(code, ErrorCode::HttpRequestDenied) {
            return HttpError::denied(url);
        }
        HttpError::new(format!("{url}: {}", code_text(&code)))
    }

    /// The refusal, in the words every SDK uses; the host adds why to the run's error
    /// (which list refused it, and how to allow it where the run was made).
    #[cfg(target_family = "wasm")]
    fn denied(url: &str) -> Self {
        HttpError {
            message: format!("{url}: the request was denied by the outbound policy"),
            kind: Kind::Denied,
        }
    }

    /// A test kit's failed request (`testing::Kit::on_http`).
    #[cfg(not(target_family = "wasm"))]
    pub(crate) fn mocked(message: String) -> Self {
        HttpError::new(message)
    }

    /// True when the host refused the request (the target is not allowed).
    pub fn is_denied(&self) -> bool {
        self.kind == Kind::Denied
    }

    /// True when trying again later may succeed: the request got no answer. False for
    /// a request the host refused, or one that could not be made as given.
    pub fn is_retryable(&self) -> bool {
        self.kind == Kind::Transport
    }
}

/// A wasi:http error code as every SDK writes it: the case's name in UpperCamelCase
/// (`ConnectionRefused`, `HttpResponseTimeout`), and an internal error's text after it.
#[cfg(target_family = "wasm")]
fn code_text(code: &ErrorCode) -> String {
    match code {
        ErrorCode::InternalError(Some(detail)) => format!("InternalError: {detail}"),
        other => {
            // Debug writes `ErrorCode::Name` or `ErrorCode::Name(payload)`: the name.
            let debug = format!("{other:?}");
            let head = debug.split(['(', ' ', '{']).next().unwrap_or_default();
            head.rsplit("::").next().unwrap_or(head).to_string()
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HttpError {}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// True for 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError::new(format!("the response is not the JSON expected: {e}")))
    }
}

/// A request being built.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, url: &str) -> Self {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header (repeatable).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Sets the body as raw bytes.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the body as JSON and `content-type: application/json`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.body = serde_json::to_vec(value).unwrap_or_default();
        if !self
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            self.headers
                .push(("content-type".into(), "application/json".into()));
        }
        self
    }

    /// The headers sent: those given, plus `content-length` for a body the request has
    /// whole (so that it goes out with a length, not `transfer-encoding: chunked`),
    /// unless given. A request with no body whose method expects none (GET, HEAD,
    /// DELETE, OPTIONS, TRACE) gets none (RFC 9110, 8.6).
    fn headers_to_send(&self) -> Vec<(String, String)> {
        let mut headers = self.headers.clone();
        let has_length = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
        let expects_no_body = matches!(
            self.method.as_str(),
            "GET" | "HEAD" | "DELETE" | "OPTIONS" | "TRACE"
        );
        if !has_length && !(self.body.is_empty() && expects_no_body) {
            headers.push(("content-length".into(), self.body.len().to_string()));
        }
        let changes = !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE");
        let has_key = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("idempotency-key"));
        if changes && !has_key {
            if let Some(key) = next_idempotency_key() {
                headers.push(("idempotency-key".into(), key));
            }
        }
        headers
    }

    /// Sends the request and reads the whole response.
    pub fn send(self) -> Result<Response, HttpError> {
        let url = Url::parse(&self.url)?;
        #[cfg(not(target_family = "wasm"))]
        {
            let _ = url;
            return crate::testing::send(crate::testing::SentRequest {
                headers: self.headers_to_send(),
                method: self.method,
                url: self.url,
                body: self.body,
            });
        }
        #[cfg(target_family = "wasm")]
        self.send_to_host(url)
    }

    /// Sends through `wasi:http/outgoing-handler`.
    #[cfg(target_family = "wasm")]
    fn send_to_host(self, url: Url) -> Result<Response, HttpError> {
        let fields = Fields::new();
        for (name, value) in &self.headers_to_send() {
            fields
                .append(&name.to_ascii_lowercase(), &value.as_bytes().to_vec())
                .map_err(|e| HttpError::invalid(format!("header `{name}`: {e:?}")))?;
        }
        let request = OutgoingRequest::new(fields);
        let method = match self.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_string()),
        };
        let bad = |what: &str| HttpError::invalid(format!("{}: invalid {what}", self.url));
        request.set_method(&method).map_err(|()| bad("method"))?;
        request
            .set_scheme(Some(&url.scheme))
            .map_err(|()| bad("scheme"))?;
        request
            .set_authority(Some(&url.authority))
            .map_err(|()| bad("authority"))?;
        request
            .set_path_with_query(Some(&url.path_with_query))
            .map_err(|()| bad("path"))?;
        let outgoing_body = request.body().map_err(|()| bad("body"))?;
        let future = outgoing_handler::handle(request, None)
            .map_err(|code| HttpError::from_code(&self.url, code))?;
        // A server may answer before it has read the whole body (and then stop
        // reading); like other HTTP clients, take its answer rather than the write error.
        // A body stream found closed says only that the request ended (refused, or the
        // connection failed; the host closes the stream at once, often before the body
        // is written): the request's own error code says why, so neither it nor the
        // short body's size error at `finish` is kept.
        let mut write_error = None;
        let mut closed = false;
        {
            let stream = outgoing_body.write().map_err(|()| bad("body stream"))?;
            for chunk in self.body.chunks(WRITE_CHUNK) {
                match stream.blocking_write_and_flush(chunk) {
                    Ok(()) => {}
                    Err(StreamError::Closed) => {
                        closed = true;
                        break;
                    }
                    Err(StreamError::LastOperationFailed(e)) => {
                        let why = match http_error_code(&e) {
                            Some(code) => code_text(&code),
                            None => e.to_debug_string(),
                        };
                        write_error = Some(HttpError::new(format!(
                            "{}: sending the body: {why}",
                            self.url
                        )));
                        break;
                    }
                }
            }
        }
        if let Err(code) = OutgoingBody::finish(outgoing_body, None) {
            if !closed {
                write_error.get_or_insert(HttpError::from_code(&self.url, code));
            }
        }

        future.subscribe().block();
        let incoming = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => {
                return Err(write_error.unwrap_or(HttpError::from_code(&self.url, code)))
            }
            Some(Err(())) | None => {
                return Err(write_error
                    .unwrap_or_else(|| HttpError::new(format!("{}: no response", self.url))))
            }
        };
        let status = incoming.status();
        let headers = incoming
            .headers()
            .entries()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let unreadable = || HttpError::new(format!("{}: the response has no body", self.url));
        let body = incoming.consume().map_err(|()| unreadable())?;
        let mut bytes = Vec::new();
        {
            let stream = body.stream().map_err(|()| unreadable())?;
            loop {
                match stream.blocking_read(READ_CHUNK) {
                    Ok(chunk) => bytes.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        let why = match http_error_code(&e) {
                            Some(code) => code_text(&code),
                            None => e.to_debug_string(),
                        };
                        return Err(HttpError::new(format!(
                            "{}: reading the response: {why}",
                            self.url
                        )));
                    }
                }
            }
        }
        let _ = IncomingBody::finish(body);
        Ok(Response {
            status,
            headers,
            body: bytes,
        })
    }
}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, HttpError> {
    Request::new("GET", url).send()
}

/// `POST url` with `value` as a JSON body.
pub fn post_json<T: Serialize + ?Sized>(url: &str, value: &T) -> Result<Response, HttpError> {
    Request::new("POST", url).json(value).send()
}

/// The parts of an absolute `http://` or `https://` URL that wasi:http wants.
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
struct Url {
    scheme: Scheme,
    authority: String,
    path_with_query: String,
}

impl Url {
    fn parse(url: &str) -> Result<Url, HttpError> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else {
            return Err(HttpError::invalid(format!(
                "{url}: only absolute http:// and https:// URLs are supported"
            )));
        };
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.is_empty() {
            return Err(HttpError::invalid(format!("{url}: no host")));
        }
        let path_with_query = match path {
            "" => "/".to_string(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_string(),
        };
        Ok(Url {
            scheme,
            authority: authority.to_string(),
            path_with_query,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(r: &Request) -> Vec<(String, String)> {
        r.headers_to_send()
    }

    #[test]
    fn a_whole_body_goes_out_with_its_length() {
        let r = Request::new("POST", "http://x/").json(&serde_json::json!({"a": 1}));
        assert!(sent(&r).contains(&("content-length".into(), "7".into())));
        let empty_post = Request::new("POST", "http://x/");
        assert!(sent(&empty_post).contains(&("content-length".into(), "0".into())));
        // A length given is kept, not doubled.
        let given = Request::new("PUT", "http://x/")
            .header("Content-Length", "3")
            .body("abc");
        let lengths: Vec<_> = sent(&given)
            .into_iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .collect();
        assert_eq!(lengths, [("Content-Length".to_string(), "3".to_string())]);
    }

    #[test]
    fn a_get_without_a_body_has_no_length() {
        for method in ["GET", "head", "DELETE", "OPTIONS"] {
            let r = Request::new(method, "http://x/");
            assert!(
                !sent(&r).iter().any(|(k, _)| k == "content-length"),
                "{method}"
            );
        }
        let get_with_body = Request::new("GET", "http://x/").body("q");
        assert!(sent(&get_with_body).contains(&("content-length".into(), "1".into())));
    }
}
