//! `chat-notify`: formats a message from a template and posts it to a chat webhook
//! (Slack, Mattermost, Rocket.Chat and Discord-compatible incoming webhooks).
//!
//! Input: `{"webhook_url": "https://hooks.slack.com/...", "template": "Deploy of {service}
//! finished: {status}", "vars": {"service": "api", "status": "ok"}, "username"?: "kairos",
//! "format"?: "slack" | "discord"}`. `{name}` in the template is replaced by `vars.name`
//! (strings as they are, other JSON values as JSON); `{{` and `}}` are literal braces; an
//! unknown name is an error, so that a typo never posts a half-filled message. The
//! built-in names `{life_id}`, `{attempt}` and `{scheduled_at}` come from the firing.
//! Output: `{"status": 200, "text": "..."}`.

use std::collections::BTreeMap;

use kairos_guest::{export_action, http, schedule, Context, Error};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Input {
    webhook_url: String,
    template: String,
    #[serde(default)]
    vars: BTreeMap<String, Value>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    format: Format,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Format {
    #[default]
    Slack,
    Discord,
}

#[derive(Serialize)]
struct Output {
    status: u16,
    text: String,
}

fn render(template: &str, vars: &BTreeMap<String, Value>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            return Err(format!(
                "unmatched `}}` at byte {}",
                template.len() - tail.len()
            ));
        }
        let end = tail
            .find('}')
            .ok_or_else(|| format!("unclosed `{{` at byte {}", template.len() - tail.len()))?;
        let name = tail[1..end].trim();
        match vars.get(name) {
            Some(Value::String(s)) => out.push_str(s),
            Some(other) => out.push_str(&other.to_string()),
            None => return Err(format!("the template names `{name}`, which vars lacks")),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn run(ctx: Context, input: Input) -> Result<Output, Error> {
    let mut vars = input.vars;
    vars.entry("life_id".into()).or_insert(json!(ctx.life_id));
    vars.entry("attempt".into()).or_insert(json!(ctx.attempt));
    vars.entry("scheduled_at".into())
        .or_insert(json!(schedule::rfc3339_ms(ctx.scheduled_at_ms)));
    let text = render(&input.template, &vars).map_err(Error::fatal)?;
    let mut body = match input.format {
        Format::Slack => json!({ "text": text }),
        Format::Discord => json!({ "content": text }),
    };
    if let Some(user) = input.username {
        body["username"] = json!(user);
    }
    let response = http::post_json(&input.webhook_url, &body)?;
    match response.status {
        200..=299 => Ok(Output {
            status: response.status,
            text,
        }),
        429 | 500..=599 => Err(Error::retryable(format!(
            "the chat webhook answered {}",
            response.status
        ))),
        other => Err(Error::fatal(format!(
            "the chat webhook answered {other}: {}",
            response.text()
        ))),
    }
}

export_action!(run);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_names_literals_and_refuses_unknown_names() {
        let vars: BTreeMap<String, Value> =
            [("a".to_string(), json!("x")), ("n".to_string(), json!(3))].into();
        assert_eq!(render("{a}-{ n }-{{lit}}", &vars).unwrap(), "x-3-{lit}");
        assert!(render("{missing}", &vars).unwrap_err().contains("missing"));
        assert!(render("open {a", &vars).is_err());
    }
}
