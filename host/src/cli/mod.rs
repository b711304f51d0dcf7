//! The command-line client over the REST API of a running host (SPEC section 9):
//! `kairos book|ls|show|cancel|timers|queues|plugins`.
//!
//! Every command prints tables or readable summaries by default and the API's JSON with
//! `--output json`. Exit codes: 0 done; 1 refused by the server (its status, error code
//! and message are printed) or the server could not be reached; 2 a usage error (an
//! unknown flag, a missing argument).

mod admin;
mod check;
mod client;
mod new_plugin;
mod plugins;
mod print;
mod summaries;

/// Percent-encodes a path segment or query value, as the CLI does (tests use it too).
pub use client::encode as percent_encode;

use std::io::Read;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use http::Method;
use serde_json::{json, Value};

use admin::{queues, timers};
pub use admin::{QueuesCommand, TasksCommand, TimerFields, TimersCommand};
use client::{encode, query, Api};
use plugins::plugins;
pub use plugins::PluginsCommand;
pub use print::Output;
use print::{emit, print_json, text, Table};

/// Where the host is, how to authenticate, and how to print.
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
    /// How answers are printed: tables and summaries, or the API's JSON.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

/// A request body: JSON text (`--json`), a file, or stdin (`-`).
#[derive(Debug, Clone, Args)]
pub struct Body {
    /// The body as JSON text.
    #[arg(long, conflicts_with = "file")]
    json: Option<String>,
    /// A file holding the body, or `-` for stdin.
    file: Option<String>,
}

impl Body {
    /// The bytes given; stdin when neither text nor a file was named and `stdin_default`.
    fn read(&self, stdin_default: bool) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(match (&self.json, self.file.as_deref()) {
            (Some(text), _) => Some(text.clone().into_bytes()),
            (None, Some("-")) => Some(read_stdin()?),
            (None, None) if stdin_default => Some(read_stdin()?),
            (None, None) => None,
            (None, Some(path)) => {
                Some(std::fs::read(path).with_context(|| format!("cannot read {path}"))?)
            }
        })
    }
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut text = Vec::new();
    std::io::stdin()
        .read_to_end(&mut text)
        .context("cannot read stdin")?;
    Ok(text)
}

/// Client commands.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Book a Life: the body of POST /schedules, from --json, a file, or stdin (`-`).
    /// Many Lives: a JSON list of bookings, or one booking per line (JSON lines), sent
    /// 1,000 at a time to POST /schedules/batch; each line's result is printed, and the
    /// exit code is 1 when any was refused.
    Book {
        #[command(flatten)]
        body: Body,
    },
    /// List Lives (GET /schedules).
    Ls {
        #[arg(long)]
        state: Option<String>,
        /// Only finished Lives that came to this: succeeded, cancelled, birth_failed,
        /// death_failed, invalidated.
        #[arg(long)]
        outcome: Option<String>,
        #[arg(long)]
        resource_id: Option<String>,
        /// The latest birth first.
        #[arg(long)]
        desc: bool,
        /// Lives born at or after this time.
        #[arg(long)]
        from: Option<String>,
        /// Lives born at or before this time.
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this cursor (the `next_cursor` of the page before).
        #[arg(long)]
        cursor: Option<String>,
        /// Follow next_cursor until every matching Life is listed.
        #[arg(long)]
        all: bool,
        /// Same as `--output json`.
        #[arg(long, hide = true)]
        json: bool,
    },
    /// The Lives that failed (a birth or death failed for good, or a birth invalidated),
    /// the most recently finished first, with why.
    Failures {
        /// Only birth_failed, death_failed or invalidated.
        #[arg(long)]
        outcome: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this cursor (the `next_cursor` of the page before).
        #[arg(long)]
        cursor: Option<String>,
        /// Follow next_cursor until every failed Life is listed.
        #[arg(long)]
        all: bool,
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
        /// Same as `--output json`.
        #[arg(long, hide = true)]
        json: bool,
    },
    /// Task queues: a table of them, or one of the commands below.
    Queues {
        #[command(subcommand)]
        command: Option<QueuesCommand>,
        /// Same as `--output json`.
        #[arg(long, hide = true)]
        json: bool,
    },
}

/// Runs one client command.
pub async fn run(target: Target, command: ClientCommand) -> anyhow::Result<()> {
    let output = target.output;
    let json_if = |json: bool| if json { Output::Json } else { output };
    if let ClientCommand::Timers {
        command:
            Some(TimersCommand::Check {
                schedule,
                tz,
                from,
                count,
                batch,
                json,
            }),
        json: json_too,
    } = command
    {
        let json = json || json_too || output == Output::Json;
        return match (batch, schedule) {
            (true, _) => check::check_batch(),
            (false, Some(schedule)) => {
                check::check_schedule(&schedule, &tz, from.as_deref(), count, json)
            }
            (false, None) => bail!("a schedule to check is needed (or --batch)"),
        };
    }
    let api = Api::new(target)?;
    match command {
        ClientCommand::Book { body } => {
            let body = body.read(true)?.unwrap_or_default();
            if let Some(bookings) = many_bookings(&body)? {
                return book_many(&api, bookings, output).await;
            }
            let booked = api.call(Method::POST, "/schedules", Some(body)).await?;
            match output {
                Output::Json => print_json(&booked),
                Output::Table => println!(
                    "booked {} ({}, {})",
                    text(&booked["life_uuid"]),
                    text(&booked["schedule_type"]),
                    text(&booked["birth_time"])
                ),
            }
        }
        ClientCommand::Ls {
            state,
            outcome,
            resource_id,
            desc,
            from,
            to,
            limit,
            cursor,
            all,
            json,
        } => {
            let filters = [
                ("state", state),
                ("outcome", outcome),
                ("resource_id", resource_id),
                ("from", from),
                ("to", to),
                ("order", desc.then(|| "desc".to_string())),
                ("limit", Some(limit.to_string())),
            ];
            list_lives(&api, "/schedules", &filters, cursor, all, json_if(json)).await?
        }
        ClientCommand::Failures {
            outcome,
            limit,
            cursor,
            all,
        } => {
            let filters = [("outcome", outcome), ("limit", Some(limit.to_string()))];
            list_lives(&api, "/failures", &filters, cursor, all, output).await?
        }
        ClientCommand::Plugins { command } => plugins(&api, command, output).await?,
        ClientCommand::Show { life_uuid } => {
            let life = api
                .get(&format!("/schedules/{}", encode(&life_uuid)))
                .await?;
            match output {
                Output::Json => print_json(&life),
                Output::Table => print!("{}", print::life(&life)),
            }
        }
        ClientCommand::Timers { command, json } => timers(&api, command, json_if(json)).await?,
        ClientCommand::Queues { command, json } => queues(&api, command, json_if(json)).await?,
        ClientCommand::Cancel { life_uuid, force } => {
            let path = format!(
                "/schedules/{}{}",
                encode(&life_uuid),
                if force { "?force=true" } else { "" }
            );
            emit(output, &api.call(Method::DELETE, &path, None).await?);
        }
    }
    Ok(())
}

/// `kairos ls` and `kairos failures`: pages of Lives from `path`, each printed as it
/// arrives (so `--all` over a million Lives streams), from `cursor`.
async fn list_lives(
    api: &Api,
    path: &str,
    filters: &[(&str, Option<String>)],
    mut cursor: Option<String>,
    all: bool,
    output: Output,
) -> anyhow::Result<()> {
    let failures = path == "/failures";
    // Each column's field and heading; the last one is not padded.
    let columns: &[(&str, &str, usize)] = if failures {
        &[
            ("life_uuid", "LIFE", 34),
            ("schedule_type", "TYPE", 6),
            ("outcome", "OUTCOME", 13),
            ("finished_at", "FINISHED", 25),
            ("outcome_reason", "WHY", 0),
        ]
    } else {
        &[
            ("life_uuid", "LIFE", 34),
            ("schedule_type", "TYPE", 6),
            ("state", "STATE", 11),
            ("outcome", "OUTCOME", 13),
            ("birth_time", "BIRTH", 25),
            ("death_time", "DEATH", 25),
            ("resource_id", "RESOURCE", 0),
        ]
    };
    let row = |cell: &dyn Fn(&str, &str) -> String| {
        let cells: Vec<String> = columns
            .iter()
            .map(|(field, heading, width)| format!("{:<width$}", cell(field, heading)))
            .collect();
        cells.join(" ").trim_end().to_string()
    };
    if output == Output::Table {
        println!("{}", row(&|_, heading| heading.to_string()));
    }
    loop {
        let mut pairs = filters.to_vec();
        pairs.push(("cursor", cursor.clone()));
        let page = api.get(&format!("{path}{}", query(&pairs))).await?;
        if output == Output::Json {
            print_json(&page);
        } else {
            for life in page["items"].as_array().into_iter().flatten() {
                println!("{}", row(&|field, _| text(&life[field])));
            }
        }
        match page["next_cursor"].as_str() {
            Some(next) if all => cursor = Some(next.to_string()),
            Some(next) => {
                if output == Output::Table {
                    eprintln!("(more: --all, or --cursor {next})");
                }
                return Ok(());
            }
            None => return Ok(()),
        }
    }
}

/// Lists the `key` array of what `path` answers as a table, a row per item, or prints
/// the API's JSON.
async fn list_table(
    api: &Api,
    path: &str,
    key: &str,
    output: Output,
    headers: &[&'static str],
    row: impl Fn(&Value) -> Vec<String>,
) -> anyhow::Result<()> {
    let mut list = api.get(path).await?;
    // A paged list (`next_cursor`): every page, in order. The cursor moves on with each
    // page; the bound only guards against a server that repeats one.
    for _ in 0..100_000 {
        let Some(cursor) = list["next_cursor"].as_str().map(str::to_string) else {
            break;
        };
        let sep = if path.contains('?') { '&' } else { '?' };
        let page = api
            .get(&format!("{path}{sep}limit=1000&cursor={}", encode(&cursor)))
            .await?;
        if let (Some(items), Some(more)) = (list[key].as_array_mut(), page[key].as_array()) {
            items.extend(more.iter().cloned());
        }
        list["next_cursor"] = page["next_cursor"].clone();
    }
    if output == Output::Json {
        print_json(&list);
        return Ok(());
    }
    let mut table = Table::new(headers);
    for item in list[key].as_array().into_iter().flatten() {
        table.row(row(item));
    }
    print!("{}", table.render());
    Ok(())
}

/// The bookings of a `kairos book` input that holds more than one: a JSON list, or JSON
/// lines (one booking per line, blank lines skipped). None for one booking (a JSON
/// object, sent to `POST /schedules` as it is).
fn many_bookings(body: &[u8]) -> anyhow::Result<Option<Vec<Value>>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => return Ok(Some(items)),
        Ok(_) => return Ok(None),
        Err(_) => {}
    }
    let text = std::str::from_utf8(body).context("the bookings are not UTF-8 text")?;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let item: Value = serde_json::from_str(line)
            .with_context(|| format!("line {}: not a JSON booking", n + 1))?;
        items.push(item);
    }
    if items.len() < 2 {
        // One booking (or none) that is not valid JSON: the server says why.
        return Ok(None);
    }
    Ok(Some(items))
}

/// Books `bookings` through `POST /schedules/batch`, a batch of at most 1,000 at a time,
/// printing each one's result in order; fails when any was refused.
async fn book_many(api: &Api, bookings: Vec<Value>, output: Output) -> anyhow::Result<()> {
    const BATCH: usize = 1000;
    let (mut booked, mut refused) = (0u64, 0u64);
    let mut all = Vec::new();
    for (chunk_no, chunk) in bookings.chunks(BATCH).enumerate() {
        let body = serde_json::to_vec(&json!({ "bookings": chunk }))?;
        let answer = api
            .call(Method::POST, "/schedules/batch", Some(body))
            .await?;
        let items = answer["items"].as_array().cloned().unwrap_or_default();
        for (i, item) in items.into_iter().enumerate() {
            let n = chunk_no * BATCH + i + 1;
            if item["status"] == 200 {
                booked += 1;
                let b = &item["booking"];
                if output == Output::Table {
                    println!(
                        "{n}: booked {} ({}, {})",
                        text(&b["life_uuid"]),
                        text(&b["schedule_type"]),
                        text(&b["birth_time"])
                    );
                }
            } else {
                refused += 1;
                if output == Output::Table {
                    println!(
                        "{n}: refused {} {}: {}",
                        item["status"],
                        text(&item["error"]["code"]),
                        text(&item["error"]["message"])
                    );
                }
            }
            all.push(item);
        }
    }
    match output {
        Output::Json => print_json(&json!({"items": all, "booked": booked, "refused": refused})),
        Output::Table => println!("{booked} booked, {refused} refused"),
    }
    if refused > 0 {
        bail!("{refused} of {} bookings were refused", booked + refused);
    }
    Ok(())
}
