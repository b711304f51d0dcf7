//! The command-line client: `kairos book|ls|show|cancel|timers|queues` over the REST API
//! of a running host (SPEC section 9). It prints the API's JSON (or a table for `ls`) and exits 1 with
//! the API's error message when the host refuses.

use std::io::Read;

use anyhow::{bail, Context};
use axum::http::{header, Method, Request};
use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Where the host is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// Base URL of the kairos API.
    #[arg(
        long,
        env = "KAIROS_SERVER",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// Bearer token, when the host requires one.
    #[arg(long, env = "KAIROS_TOKEN", global = true)]
    pub token: Option<String>,
}

/// Client commands.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Book a Life: the body of POST /schedules, from --json, a file, or stdin (`-`).
    Book {
        /// The booking as JSON text.
        #[arg(long, conflicts_with = "file")]
        json: Option<String>,
        /// A file holding the booking, or `-` for stdin.
        file: Option<String>,
    },
    /// List Lives (GET /schedules).
    Ls {
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        resource_id: Option<String>,
        /// Lives born at or after this time.
        #[arg(long)]
        from: Option<String>,
        /// Lives born at or before this time.
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Follow next_cursor until every matching Life is listed.
        #[arg(long)]
        all: bool,
        /// Print the API's JSON pages instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one Life with its Plans and history.
    Show { life_uuid: String },
    /// Cancel a Life (DELETE /schedules/{id}).
    Cancel {
        life_uuid: String,
        /// End the Life without running anything more (not while an action runs).
        #[arg(long)]
        force: bool,
    },
    /// Manage WebAssembly plugins (/plugins).
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
    },
    /// Recurring timers: a table of them, or one of the commands below.
    Timers {
        #[command(subcommand)]
        command: Option<TimersCommand>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Task queues: a table of them, or one of the commands below.
    Queues {
        #[command(subcommand)]
        command: Option<QueuesCommand>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `kairos plugins ...`
#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// List registered plugins with their latest version.
    Ls,
    /// Show a plugin and all its versions.
    Show { name: String },
    /// Upload a component (a .wasm built for wasm32-wasip2) as a new version of `name`.
    Upload {
        name: String,
        /// The component file.
        file: String,
        /// Hosts the plugin may call: `host` or `host:port`, comma separated; `*` for any
        /// public address.
        #[arg(long)]
        allowed_hosts: Option<String>,
        /// Memory cap in MiB (1..=1024).
        #[arg(long)]
        memory_mb: Option<u32>,
        /// Wall-time limit per run (`10s`, `500ms`).
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Delete a plugin and all its versions (refused while unfinished Lives use it).
    Delete {
        name: String,
        /// Delete even though Lives still use it (they fail when they fire).
        #[arg(long)]
        force: bool,
    },
}

/// `kairos timers ...`
#[derive(Debug, Subcommand)]
pub enum TimersCommand {
    /// One timer with a preview of its next fire times.
    Show {
        name: String,
    },
    /// A timer's runs, newest first (skipped slots included).
    Runs {
        name: String,
    },
    /// Run a timer now.
    Run {
        name: String,
    },
    Activate {
        name: String,
    },
    Deactivate {
        name: String,
    },
}

/// `kairos queues ...`
#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// One queue with its settings and task counts.
    Show {
        name: String,
    },
    /// Pending tasks of a queue.
    Tasks {
        name: String,
    },
    /// Tasks that exhausted their retries.
    Failed {
        name: String,
    },
    Pause {
        name: String,
    },
    Resume {
        name: String,
    },
}

struct Api {
    target: Target,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Api {
    fn new(target: Target) -> anyhow::Result<Api> {
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
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Value> {
        self.send(method, path, body, "application/json").await
    }

    async fn send(
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

fn query(pairs: &[(&str, Option<String>)]) -> String {
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

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

async fn plugins(api: &Api, command: PluginsCommand) -> anyhow::Result<()> {
    match command {
        PluginsCommand::Ls => {
            let list = api.call(Method::GET, "/plugins", None).await?;
            println!(
                "{:<24} {:>7} {:>9} {:>6} {:>9}  {:<25} ALLOWED HOSTS",
                "NAME", "VERSION", "SIZE", "MEMORY", "TIMEOUT", "UPLOADED"
            );
            for p in list["plugins"].as_array().into_iter().flatten() {
                let hosts: Vec<&str> = p["allowed_hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!(
                    "{:<24} {:>7} {:>9} {:>4}Mi {:>7}ms  {:<25} {}",
                    p["name"].as_str().unwrap_or("-"),
                    p["version"],
                    p["size"],
                    p["memory_mb"],
                    p["timeout_ms"],
                    p["uploaded_at"].as_str().unwrap_or("-"),
                    if hosts.is_empty() {
                        "-".to_string()
                    } else {
                        hosts.join(",")
                    }
                );
            }
        }
        PluginsCommand::Show { name } => print_json(
            &api.call(Method::GET, &format!("/plugins/{}", encode(&name)), None)
                .await?,
        ),
        PluginsCommand::Upload {
            name,
            file,
            allowed_hosts,
            memory_mb,
            timeout,
        } => {
            let bytes = std::fs::read(&file).with_context(|| format!("cannot read {file}"))?;
            let path = format!(
                "/plugins/{}{}",
                encode(&name),
                query(&[
                    ("allowed_hosts", allowed_hosts),
                    ("memory_mb", memory_mb.map(|m| m.to_string())),
                    ("timeout", timeout),
                ])
            );
            print_json(
                &api.send(Method::PUT, &path, Some(bytes), "application/wasm")
                    .await?,
            );
        }
        PluginsCommand::Delete { name, force } => {
            let path = format!(
                "/plugins/{}{}",
                encode(&name),
                if force { "?force=true" } else { "" }
            );
            print_json(&api.call(Method::DELETE, &path, None).await?);
        }
    }
    Ok(())
}

/// Runs one client command.
pub async fn run(target: Target, command: ClientCommand) -> anyhow::Result<()> {
    let api = Api::new(target)?;
    match command {
        ClientCommand::Book { json, file } => {
            let body = match (json, file.as_deref()) {
                (Some(text), _) => text.into_bytes(),
                (None, Some("-")) | (None, None) => {
                    let mut text = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut text)
                        .context("cannot read stdin")?;
                    text
                }
                (None, Some(path)) => {
                    std::fs::read(path).with_context(|| format!("cannot read {path}"))?
                }
            };
            print_json(&api.call(Method::POST, "/schedules", Some(body)).await?);
        }
        ClientCommand::Ls {
            state,
            resource_id,
            from,
            to,
            limit,
            all,
            json,
        } => {
            let mut cursor: Option<String> = None;
            if !json {
                println!(
                    "{:<34} {:<6} {:<11} {:<25} {:<25} RESOURCE",
                    "LIFE", "TYPE", "STATE", "BIRTH", "DEATH"
                );
            }
            loop {
                let path = format!(
                    "/schedules{}",
                    query(&[
                        ("state", state.clone()),
                        ("resource_id", resource_id.clone()),
                        ("from", from.clone()),
                        ("to", to.clone()),
                        ("limit", Some(limit.to_string())),
                        ("cursor", cursor.clone()),
                    ])
                );
                let page = api.call(Method::GET, &path, None).await?;
                if json {
                    print_json(&page);
                } else {
                    for life in page["items"].as_array().into_iter().flatten() {
                        let text = |k: &str| life[k].as_str().unwrap_or("-").to_string();
                        println!(
                            "{:<34} {:<6} {:<11} {:<25} {:<25} {}",
                            text("life_uuid"),
                            text("schedule_type"),
                            text("state"),
                            text("birth_time"),
                            text("death_time"),
                            text("resource_id")
                        );
                    }
                }
                match page["next_cursor"].as_str() {
                    Some(next) if all => cursor = Some(next.to_string()),
                    Some(next) => {
                        if !json {
                            eprintln!("(more: --all, or the next page starts after cursor {next})");
                        }
                        break;
                    }
                    None => break,
                }
            }
        }
        ClientCommand::Plugins { command } => plugins(&api, command).await?,
        ClientCommand::Show { life_uuid } => {
            print_json(
                &api.call(
                    Method::GET,
                    &format!("/schedules/{}", encode(&life_uuid)),
                    None,
                )
                .await?,
            );
        }
        ClientCommand::Timers { command, json } => timers(&api, command, json).await?,
        ClientCommand::Queues { command, json } => queues(&api, command, json).await?,
        ClientCommand::Cancel { life_uuid, force } => {
            let path = format!(
                "/schedules/{}{}",
                encode(&life_uuid),
                if force { "?force=true" } else { "" }
            );
            print_json(&api.call(Method::DELETE, &path, None).await?);
        }
    }
    Ok(())
}

async fn timers(api: &Api, command: Option<TimersCommand>, json: bool) -> anyhow::Result<()> {
    let (method, path) = match command {
        None => {
            let list = api.call(Method::GET, "/timers", None).await?;
            if json {
                print_json(&list);
                return Ok(());
            }
            println!(
                "{:<24} {:<22} {:<18} {:<8} {:<9} {:<25} LAST",
                "TIMER", "SCHEDULE", "TIMEZONE", "PRIO", "STATE", "NEXT RUN"
            );
            for t in list["items"].as_array().into_iter().flatten() {
                let text = |k: &str| match &t[k] {
                    Value::String(s) => s.clone(),
                    Value::Null => "-".into(),
                    other => other.to_string(),
                };
                println!(
                    "{:<24} {:<22} {:<18} {:<8} {:<9} {:<25} {}",
                    text("name"),
                    text("schedule"),
                    text("timezone"),
                    text("priority"),
                    text("state"),
                    text("next_run"),
                    text("last_outcome")
                );
            }
            return Ok(());
        }
        Some(TimersCommand::Show { name }) => (Method::GET, format!("/timers/{}", encode(&name))),
        Some(TimersCommand::Runs { name }) => {
            (Method::GET, format!("/timers/{}/runs", encode(&name)))
        }
        Some(TimersCommand::Run { name }) => {
            (Method::POST, format!("/timers/{}/run", encode(&name)))
        }
        Some(TimersCommand::Activate { name }) => {
            (Method::POST, format!("/timers/{}/activate", encode(&name)))
        }
        Some(TimersCommand::Deactivate { name }) => (
            Method::POST,
            format!("/timers/{}/deactivate", encode(&name)),
        ),
    };
    print_json(&api.call(method, &path, None).await?);
    Ok(())
}

async fn queues(api: &Api, command: Option<QueuesCommand>, json: bool) -> anyhow::Result<()> {
    let (method, path) = match command {
        None => {
            let list = api.call(Method::GET, "/queues", None).await?;
            if json {
                print_json(&list);
                return Ok(());
            }
            println!(
                "{:<24} {:<8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7}",
                "QUEUE", "STATE", "RATE/S", "BUCKET", "MAX-CONC", "PENDING", "RUNNING", "FAILED"
            );
            for q in list["items"].as_array().into_iter().flatten() {
                let text = |v: &Value| match v {
                    Value::String(s) => s.clone(),
                    Value::Null => "-".into(),
                    other => other.to_string(),
                };
                println!(
                    "{:<24} {:<8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7}",
                    text(&q["name"]),
                    text(&q["state"]),
                    text(&q["rate"]),
                    text(&q["bucket_size"]),
                    text(&q["max_concurrent"]),
                    text(&q["tasks"]["pending"]),
                    text(&q["tasks"]["running"]),
                    text(&q["tasks"]["failed"])
                );
            }
            return Ok(());
        }
        Some(QueuesCommand::Show { name }) => (Method::GET, format!("/queues/{}", encode(&name))),
        Some(QueuesCommand::Tasks { name }) => {
            (Method::GET, format!("/queues/{}/tasks", encode(&name)))
        }
        Some(QueuesCommand::Failed { name }) => {
            (Method::GET, format!("/queues/{}/failed", encode(&name)))
        }
        Some(QueuesCommand::Pause { name }) => {
            (Method::POST, format!("/queues/{}/pause", encode(&name)))
        }
        Some(QueuesCommand::Resume { name }) => {
            (Method::POST, format!("/queues/{}/resume", encode(&name)))
        }
    };
    print_json(&api.call(method, &path, None).await?);
    Ok(())
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
    }
}
