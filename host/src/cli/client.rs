//! The HTTP side of the command-line client: one request to a running host, its JSON
//! answer, or the API's refusal as an error that names status, code and message.

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::Target;

pub(super) struct Api {
    target: Target,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Api {
    pub(super) fn new(target: Target) -> anyhow::Result<Api> {
        let tls = crate::actions::webhook::tls_config(None).map_err(anyhow::Error::msg)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Api {
            target,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends a request; returns the JSON body of a 2xx, or fails with the API's message.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Value> {
        self.send(method, path, body, "application/json").await
    }

    pub(super) async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(Method::GET, path, None).await
    }

    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{}", self.target.server.trim_end_matches('/'), path);
        let mut request = Request::builder().method(method).uri(&url);
        if let Some(token) = &self.target.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .with_context(|| format!("`{url}` is not a valid URL"))?;
        let response = self
            .client
            .request(request)
            .await
            .with_context(|| format!("cannot reach kairos at {}", self.target.server))?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let code = value["error"]["code"].as_str().unwrap_or("error");
            let message = value["error"]["message"].as_str().unwrap_or("no message");
            bail!("{} {code}: {message}", status.as_u16());
        }
        Ok(value)
    }
}

/// `?k=v&...` of the pairs that have a value, percent-encoded.
pub(super) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let encoded: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if encoded.is_empty() {
        String::new()
    } else {
        format!("?{}", encoded.join("&"))
    }
}

/// Percent-encodes a path segment or query value (RFC 3986 unreserved characters stay).
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            query(&[
                ("from", Some("2030-01-01 00:00:00+09:00".into())),
                ("state", None)
            ]),
            "?from=2030-01-01%2000%3A00%3A00%2B09%3A00"
        );
        assert_eq!(query(&[("state", None)]), "");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
