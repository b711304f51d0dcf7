//! The built-in webhook action: one HTTP call per run on a pooled keep-alive client.
//!
//! The call carries `Idempotency-Key: {life_uuid}:{plan}`, the `X-Kairos-*` headers of
//! SPEC section 3 and, when a signing key is configured, `X-Kairos-Signature:
//! t={unix seconds},v1={hex HMAC-SHA256 of "{t}.{body}"}`. A connect error or timeout is
//! reported as status 599 so that `execution_retry_codes` can retry it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

use super::Fence;
use crate::model::WebhookAction;
use crate::outbound::{OutboundPolicy, PolicyResolver};

/// Status reported for a connect error or a timeout.
pub const STATUS_CONNECT_ERROR: u16 = 599;

/// Identity of the run, sent as headers.
#[derive(Debug, Clone)]
pub struct CallContext<'a> {
    pub life_uuid: &'a str,
    pub plan: &'a str,
    pub execution_count: u32,
    pub fire_at_ms: i64,
    pub resource_id: Option<&'a str>,
    /// Headers of timers and queue tasks (`X-Kairos-Queue`, `X-Kairos-Task`, ...), set
    /// after the ones above so that they may replace them (`Idempotency-Key`).
    pub extra_headers: &'a [(&'static str, String)],
    /// Asked just before the request goes out (see [`Fence`]).
    pub fence: &'a Fence,
}

/// How a call ended. `status` is 599 for connect errors and timeouts, None when the call
/// was refused before any connection (policy, bad URL).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallResult {
    pub status: Option<u16>,
    pub error: Option<String>,
    /// A plugin asked for the run to be retried (its error was `retryable`).
    pub retryable: bool,
    /// What a plugin returned, for the Plan's history.
    pub output: Option<serde_json::Value>,
    /// A plugin's log lines, for the Plan's history.
    pub logs: Vec<String>,
    /// How long the target asked to wait before the next attempt (its `Retry-After`,
    /// RFC 9110 section 10.2.3), in ms.
    pub retry_after_ms: Option<u64>,
    /// A timer run cut off by its next slot (`overlap: cancel_running`): not retried.
    pub cancelled: bool,
    /// Not called (or, for a plugin, some request not sent) because the host's lease
    /// lapsed (see [`Fence`]): nothing is recorded; whoever holds the Plan now runs it.
    pub fenced: bool,
}

/// Reads a `Retry-After` value at `now`: delay-seconds or an HTTP-date (a date in the
/// past is no wait); None when it is neither.
pub fn parse_retry_after(text: &str, now: std::time::SystemTime) -> Option<u64> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(text.parse::<u64>().unwrap_or(u64::MAX).saturating_mul(1000));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(now)
            .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
            .unwrap_or(0),
    )
}

impl CallResult {
    /// A 2xx answer, or a plugin run that returned without an error.
    pub fn is_success(&self) -> bool {
        self.error.is_none() && self.status.is_none_or(|s| (200..300).contains(&s))
    }
}

/// The connector of every outbound call: names resolved through the outbound policy.
pub type PolicyConnector = HttpsConnector<HttpConnector<PolicyResolver>>;
type HttpClient = Client<PolicyConnector, Full<Bytes>>;

/// A keep-alive client for http:// and https:// targets, shared by webhooks and plugins
/// (SPEC section 7: one outbound path). Names are resolved by `resolver`, which keeps
/// only the addresses the outbound policy allows, so a connection never goes to an
/// address that was not checked.
pub fn pooled_client<B>(
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
    resolver: PolicyResolver,
) -> Client<PolicyConnector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut connector = HttpConnector::new_with_resolver(resolver);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// TLS settings for https:// targets: the Mozilla roots compiled in (webpki-roots), plus
/// the certificates of `extra_ca_file` (PEM) when given; rustls with the ring provider.
pub fn tls_config(extra_ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
        let mut added = 0;
        for cert in certs {
            let cert = cert.map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!(
                "tls_ca_file {}: no PEM certificate in it",
                path.display()
            ));
        }
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup: {e}"))
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

/// Sends webhooks. One pool per distinct connect timeout, since hyper's connector holds
/// the connect timeout; almost every action uses the default and shares one pool.
pub struct WebhookAgent {
    clients: Mutex<HashMap<u64, HttpClient>>,
    tls: rustls::ClientConfig,
    gateway_url: Option<String>,
    policy: Arc<OutboundPolicy>,
    signing_key: Option<Vec<u8>>,
    default_connect_timeout: Duration,
    default_request_timeout: Duration,
    response_body_limit: usize,
}

impl WebhookAgent {
    pub fn new(
        gateway_url: Option<String>,
        policy: Arc<OutboundPolicy>,
        signing_key: Option<String>,
        default_connect_timeout: Duration,
        default_request_timeout: Duration,
        response_body_limit: usize,
        tls: rustls::ClientConfig,
    ) -> Self {
        WebhookAgent {
            clients: Mutex::new(HashMap::new()),
            tls,
            gateway_url,
            policy,
            signing_key: signing_key.map(String::into_bytes),
            default_connect_timeout,
            default_request_timeout,
            response_body_limit,
        }
    }

    fn client(&self, connect_timeout: Duration) -> HttpClient {
        let key = connect_timeout.as_millis() as u64;
        let mut clients = self.clients.lock().expect("webhook client map poisoned");
        clients
            .entry(key)
            .or_insert_with(|| {
                pooled_client(
                    self.tls.clone(),
                    connect_timeout,
                    PolicyResolver::new(self.policy.clone(), false),
                )
            })
            .clone()
    }

    fn target(&self, action: &WebhookAction) -> Result<Uri, String> {
        let text = match (&action.url, &action.path, &self.gateway_url) {
            (Some(url), _, _) => url.clone(),
            (None, Some(path), Some(gateway)) => format!("{gateway}{path}"),
            (None, Some(_), None) => {
                return Err("path needs gateway_url, which is not configured".into())
            }
            (None, None, _) => return Err("the action has neither url nor path".into()),
        };
        text.parse::<Uri>()
            .map_err(|e| format!("`{text}` is not a URL: {e}"))
    }

    /// Runs one call.
    pub async fn call(&self, action: &WebhookAction, ctx: &CallContext<'_>) -> CallResult {
        let refused = |error: String| CallResult {
            status: None,
            error: Some(error),
            ..Default::default()
        };
        let uri = match self.target(action) {
            Ok(uri) => uri,
            Err(e) => return refused(e),
        };
        if !matches!(uri.scheme_str(), Some("http") | Some("https")) {
            return refused(format!(
                "{uri}: only http:// and https:// targets can be called"
            ));
        }
        let request_timeout = action
            .request_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.default_request_timeout);
        // The policy's DNS lookup counts against the request's time too.
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(request_timeout, self.policy.check(&uri)).await {
            Ok(Ok(())) => {}
            Ok(Err(denied)) => return refused(denied),
            Err(_) => {
                return CallResult {
                    status: Some(STATUS_CONNECT_ERROR),
                    error: Some(format!(
                        "the target's name did not resolve within the request timeout of {} ms",
                        request_timeout.as_millis()
                    )),
                    ..Default::default()
                }
            }
        }
        let (body, is_json) = match &action.body {
            None => (Bytes::new(), false),
            Some(serde_json::Value::String(s)) => (Bytes::from(s.clone()), false),
            Some(v) => (
                Bytes::from(serde_json::to_vec(v).expect("JSON serializes")),
                true,
            ),
        };
        let method = match Method::from_bytes(action.method.as_bytes()) {
            Ok(m) => m,
            Err(_) => return refused(format!("`{}` is not an HTTP method", action.method)),
        };
        let mut request = Request::builder().method(method).uri(uri);
        let headers = request.headers_mut().expect("builder is valid so far");
        for (name, value) in &action.headers {
            if is_host_header(name) {
                // Only the host sets these: targets trust them (SPEC section 3).
                continue;
            }
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(n, v);
            }
        }
        if is_json && !headers.contains_key("content-type") {
            headers.insert("content-type", HeaderValue::from_static("application/json"));
        }
        let mut set = |name: &'static str, value: String| {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        };
        set("idempotency-key", format!("{}:{}", ctx.life_uuid, ctx.plan));
        set("x-kairos-life", ctx.life_uuid.to_string());
        set("x-kairos-plan", ctx.plan.to_string());
        set(
            "x-kairos-retry-count",
            ctx.execution_count.saturating_sub(1).to_string(),
        );
        set("x-kairos-execution-count", ctx.execution_count.to_string());
        set("x-kairos-eta", ctx.fire_at_ms.to_string());
        if let Some(rid) = ctx.resource_id {
            set("x-kairos-resource", rid.to_string());
        }
        for (name, value) in ctx.extra_headers {
            set(name, value.clone());
        }
        if let Some(key) = &self.signing_key {
            set(
                "x-kairos-signature",
                sign(key, chrono::Utc::now().timestamp(), &body),
            );
        }
        let request = match request.body(Full::new(body)) {
            Ok(r) => r,
            Err(e) => return refused(format!("cannot build the request: {e}")),
        };
        let connect_timeout = action
            .connect_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.default_connect_timeout);
        let request_timeout = request_timeout.saturating_sub(started.elapsed());
        let client = self.client(connect_timeout);
        let limit = self.response_body_limit;
        if !ctx.fence.holds() {
            return CallResult {
                error: Some("not called: this host's lease lapsed before the call".into()),
                fenced: true,
                ..Default::default()
            };
        }
        let exchange = async move {
            let response = client.request(request).await?;
            let status = response.status().as_u16();
            let retry_after_ms = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
            // Read (and drop) at most `limit` bytes so the connection can be reused; a
            // larger body is cut off and its connection closed.
            let mut body = response.into_body();
            let mut read = 0usize;
            while read <= limit {
                match body.frame().await {
                    Some(Ok(frame)) => read += frame.data_ref().map(|d| d.len()).unwrap_or(0),
                    Some(Err(_)) | None => break,
                }
            }
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after_ms))
        };
        match tokio::time::timeout(request_timeout, exchange).await {
            Ok(Ok((status, retry_after_ms))) => CallResult {
                status: Some(status),
                error: (!(200..300).contains(&status)).then(|| format!("target answered {status}")),
                retry_after_ms: retry_after_ms.filter(|_| !(200..300).contains(&status)),
                ..Default::default()
            },
            Ok(Err(e)) => CallResult {
                status: Some(STATUS_CONNECT_ERROR),
                error: Some(format!("connection failed: {}", error_chain(&e))),
                ..Default::default()
            },
            Err(_) => CallResult {
                status: Some(STATUS_CONNECT_ERROR),
                error: Some(format!(
                    "no response within {} ms",
                    request_timeout.as_millis()
                )),
                ..Default::default()
            },
        }
    }
}

/// Headers only the host sets on a call (`X-Kairos-*`, `Idempotency-Key`): a copy in
/// an action's `headers` or a deferred request is dropped, never forwarded, since
/// targets trust them to come from kairos.
pub fn is_host_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("x-kairos-") || name == "idempotency-key"
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `t={unix seconds},v1={hex HMAC-SHA256(key, "{t}.{body}")}`.
pub fn sign(key: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={unix_seconds},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_vector() {
        // echo -n '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        assert_eq!(
            sign(b"secret", 1_700_000_000, br#"{"a":1}"#),
            "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
        );
        assert_ne!(sign(b"secret", 1, b"x"), sign(b"other", 1, b"x"));
    }

    /// Waits up to `wait` for a connection on `listener`.
    fn connected(listener: &std::net::TcpListener, wait: Duration) -> bool {
        let until = std::time::Instant::now() + wait;
        loop {
            match listener.accept() {
                Ok(_) => return true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= until {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }

    #[tokio::test]
    async fn a_fence_that_no_longer_holds_stops_the_call_before_it_connects() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let allowed = vec![crate::config::AllowedHost::Host {
            host: "127.0.0.1".into(),
            port: None,
        }];
        let agent = WebhookAgent::new(
            None,
            Arc::new(OutboundPolicy::new(allowed, None)),
            None,
            Duration::from_secs(2),
            Duration::from_secs(2),
            1024,
            tls_config(None).unwrap(),
        );
        let action = WebhookAction {
            path: None,
            url: Some(format!("http://127.0.0.1:{port}/hook")),
            method: "POST".into(),
            headers: Default::default(),
            body: None,
            connect_timeout_ms: None,
            // Nobody answers: the call that does go out ends at this timeout.
            request_timeout_ms: Some(300),
            retry_count: 0,
            retry_interval_ms: 0,
            callbacks: Default::default(),
        };
        let lapsed = Fence::new(|| false);
        let ctx = |fence| CallContext {
            life_uuid: "life",
            plan: "birth",
            execution_count: 1,
            fire_at_ms: 0,
            resource_id: None,
            extra_headers: &[],
            fence,
        };
        let result = agent.call(&action, &ctx(&lapsed)).await;
        assert!(result.fenced, "{result:?}");
        assert_eq!(result.status, None);
        assert!(
            !connected(&listener, Duration::from_millis(300)),
            "a fenced call connected"
        );
        // The same call under a fence that holds does go out.
        let holds = Fence::new(|| true);
        let result = agent.call(&action, &ctx(&holds)).await;
        assert!(!result.fenced, "{result:?}");
        assert!(
            connected(&listener, Duration::from_secs(2)),
            "no call went out"
        );
    }
}
