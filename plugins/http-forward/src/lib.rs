//! `http-forward`: sends a JSON body to a URL and returns the status.
//!
//! Input: `{"url": "https://...", "method"?: "POST", "headers"?: {"name": "value"},
//! "body": any}`. Output: `{"status": 200}`. A 408, 429 or 5xx answer, or no answer,
//! is a retryable error (the action's `retry_count` decides how often); another non-2xx
//! answer fails the Plan. The input's JSON Schema is derived from `Input`, so kairos
//! refuses a booking whose input does not fit (400 `invalid_input`).

use std::collections::BTreeMap;

use kairos_guest::{export_action, http, info, Context, Error};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
struct Input {
    /// Where to send the request.
    url: String,
    /// The HTTP method; POST when not given.
    #[serde(default = "post")]
    method: String,
    /// Headers to send, besides `x-kairos-life` and `idempotency-key`.
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// The JSON body.
    #[serde(default)]
    body: serde_json::Value,
}

fn post() -> String {
    "POST".into()
}

#[derive(Serialize)]
struct Output {
    status: u16,
}

fn run(ctx: Context, input: Input) -> Result<Output, Error> {
    let mut request = http::Request::new(&input.method, &input.url)
        .header("x-kairos-life", &ctx.life_id)
        .header(
            "idempotency-key",
            &format!("{}:{}", ctx.life_id, ctx.scheduled_at_ms),
        );
    for (name, value) in &input.headers {
        request = request.header(name, value);
    }
    let response = request.json(&input.body).send()?;
    info!("{} {} -> {}", input.method, input.url, response.status);
    match response.status {
        200..=299 => Ok(Output {
            status: response.status,
        }),
        408 | 429 | 500..=599 => Err(Error::retryable(format!(
            "{} answered {}",
            input.url, response.status
        ))),
        other => Err(Error::fatal(format!("{} answered {other}", input.url))),
    }
}

export_action!(run, input_schema);

/// `run` in a native `cargo test`, through the guest SDK's test kit.
#[cfg(test)]
mod tests {
    use kairos_guest::testing::{self, Kit};

    use super::run;

    const INPUT: &str =
        r#"{"url": "https://hooks.example.com/x", "headers": {"x-team": "ops"}, "body": {"n": 1}}"#;

    #[test]
    fn forwards_the_body_and_reports_the_status() {
        let kit = Kit::new().on_http(|_| Ok(testing::response(202, "")));
        assert_eq!(
            testing::call(run, testing::context(), INPUT),
            Ok(r#"{"status":202}"#.to_string())
        );
        let sent = &kit.requests()[0];
        assert_eq!(sent.method, "POST");
        assert_eq!(sent.url, "https://hooks.example.com/x");
        assert_eq!(sent.json(), serde_json::json!({"n": 1}));
        assert_eq!(sent.header("x-team"), Some("ops"));
        assert_eq!(sent.header("x-kairos-life"), Some("test-life"));
        assert_eq!(
            sent.header("idempotency-key"),
            Some("test-life:1800000000000")
        );
        assert_eq!(
            kit.logs(),
            ["info: POST https://hooks.example.com/x -> 202"]
        );
    }

    #[test]
    fn the_input_schema_requires_a_url_string_and_nothing_else() {
        let schema = testing::input_schema(run);
        assert_eq!(schema["required"], serde_json::json!(["url"]));
        assert_eq!(schema["properties"]["url"]["type"], "string");
        assert_eq!(schema["properties"]["headers"]["type"], "object");
    }

    #[test]
    fn a_5xx_or_no_answer_is_retried_and_a_4xx_is_not() {
        let _kit = Kit::new().on_http(|_| Ok(testing::response(503, "")));
        let err = testing::call(run, testing::context(), INPUT).unwrap_err();
        assert!(err.retryable, "{err:?}");
        let _kit = Kit::new().on_http(|_| Ok(testing::response(404, "")));
        let err = testing::call(run, testing::context(), INPUT).unwrap_err();
        assert!(!err.retryable && err.message.contains("404"), "{err:?}");
        let _kit = Kit::new().on_http(|_| Err("connection refused".into()));
        assert!(
            testing::call(run, testing::context(), INPUT)
                .unwrap_err()
                .retryable
        );
    }

    #[test]
    fn a_url_that_is_not_http_fails_for_good_and_sends_nothing() {
        let kit = Kit::new().on_http(|_| Ok(testing::response(200, "")));
        let err = testing::call(
            run,
            testing::context(),
            r#"{"url": "ftp://files.example/x"}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "ftp://files.example/x: only absolute http:// and https:// URLs are supported"
        );
        assert!(!err.retryable, "{err:?}");
        assert!(kit.requests().is_empty());
    }
}
