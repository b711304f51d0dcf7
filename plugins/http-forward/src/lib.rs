//! `http-forward`: sends a JSON body to a URL and returns the status.
//!
//! Input: `{"url": "https://...", "method"?: "POST", "headers"?: {"name": "value"},
//! "body": any}`. Output: `{"status": 200}`. A 408, 429 or 5xx answer, or no answer,
//! is a retryable error (the action's `retry_count` decides how often); another non-2xx
//! answer fails the Plan.

use std::collections::BTreeMap;

use kairos_guest::{export_action, http, info, Context, Error};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    url: String,
    #[serde(default = "post")]
    method: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
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

export_action!(run);
