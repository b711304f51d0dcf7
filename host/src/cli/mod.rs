//! The command-line client over the REST API of a running host (SPEC section 9):
//! `kairos book|ls|show|cancel|timers|queues|plugins`.
//!
//! Every command prints tables or readable summaries by default and the API's JSON with
//! `--output json`. Exit codes: 0 done; 1 refused by the server (its status, error code
//! and message are printed) or the server could not be reached; 2 a usage error (an
//! unknown flag, a missing argument).

mod check;
mod client;
mod new_plugin;
mod print;
mod summaries;

use std::io::Read;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use http::Method;
use serde_json::{json, Value};

use client::{encode, query, Api};
pub use print::Output;
use print::{action_summary, emit, print_json, text, Table};

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

/// `kairos plugins ...`
#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// List registered plugins with their latest version.
    Ls,
    /// Show a plugin and all its versions.
    Show { name: String },
    /// Upload a component (a .wasm built for wasm32-wasip2) as a new version of `name`.
    #[command(visible_alias = "push")]
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
        /// Answer as soon as the server does: a large component (JavaScript, Python) is
        /// then still compiling. By default the command waits until it is ready.
        #[arg(long)]
        no_wait: bool,
    },
    /// Run a component file once, here, in the sandbox a firing uses, with no server or
    /// Redis: prints its output or error, its logs, each outbound request with the
    /// policy's answer, and the time taken (exit 1 when the run fails).
    Run {
        /// The component file (.wasm built for wasm32-wasip2).
        file: String,
        /// The input, as the booking's `input` (JSON).
        #[arg(long, default_value = "{}")]
        input: String,
        /// A host it may call, `host` or `host:port` (repeat, or comma separate); none by
        /// default. Loopback targets are allowed only when named here.
        #[arg(long, value_delimiter = ',')]
        allow: Vec<String>,
        /// Memory cap in MiB.
        #[arg(long, default_value_t = 64)]
        memory_mb: u32,
        /// Wall-time limit (`10s`, `500ms`).
        #[arg(long, default_value = "10s")]
        timeout: String,
        /// Time one outbound request may take to answer, as the host's
        /// --request-timeout (`30s`, `500ms`).
        #[arg(long, default_value = "30s")]
        request_timeout: String,
    },
    /// Write a new plugin project, NAME/, that builds and tests as is: in Rust (a
    /// crate), JavaScript or Python (--lang), with an example action and its tests, the
    /// guest SDK of its language and the WIT files it is built against. The first step
    /// of a new plugin.
    New {
        name: String,
        /// The plugin's language: rust, js or python.
        #[arg(long, default_value = "rust")]
        lang: String,
        /// Where to write NAME/ (default: here).
        #[arg(long, default_value = ".")]
        dir: String,
    },
    /// Delete a plugin and all its versions (refused while unfinished Lives use it).
    #[command(visible_alias = "rm")]
    Delete {
        name: String,
        /// Delete even though Lives still use it (they fail when they fire).
        #[arg(long)]
        force: bool,
    },
}

/// What a timer is made of, for `create` and `edit`; `--json` gives a whole body instead.
#[derive(Debug, Clone, Args)]
pub struct TimerFields {
    /// A cron expression (`0 9 * * 1-5`, `@daily`) or times of day (`02:00 18:00`).
    #[arg(long)]
    schedule: Option<String>,
    /// IANA zone the schedule is read in.
    #[arg(long)]
    tz: Option<String>,
    /// The action as JSON: `{"path": "/hook", "method": "POST"}`, a `url`, or a `plugin`.
    #[arg(long)]
    action: Option<String>,
    /// A webhook action calling this URL (or a path under the host's gateway).
    #[arg(long, conflicts_with = "action")]
    url: Option<String>,
    /// The webhook's method, with --url.
    #[arg(long, requires = "url", default_value = "POST")]
    method: String,
    /// 1 (high) to 4 (low).
    #[arg(long)]
    priority: Option<u8>,
    /// Time limit of one run (`30s`).
    #[arg(long)]
    timeout: Option<String>,
    /// Retries of a failed run.
    #[arg(long)]
    retries: Option<u32>,
    /// The whole body as JSON text (the fields above are added to it).
    #[arg(long)]
    json: Option<String>,
}

/// The JSON object a `--json` flag gives (or an empty one), for flags to add fields to.
fn json_object(text: Option<&str>) -> anyhow::Result<Value> {
    let body = match text {
        Some(text) => serde_json::from_str(text).context("--json is not valid JSON")?,
        None => json!({}),
    };
    if !body.is_object() {
        bail!("--json must be a JSON object");
    }
    Ok(body)
}

/// The webhook action of a `--url`: a full URL, or a path under the host's gateway.
fn webhook_action(url: &str, method: &str) -> Value {
    let key = if url.starts_with('/') { "path" } else { "url" };
    json!({key: url, "method": method})
}

impl TimerFields {
    fn body(&self, name: Option<&str>) -> anyhow::Result<Value> {
        let mut body = json_object(self.json.as_deref())?;
        let map = body.as_object_mut().expect("json_object gives an object");
        if let Some(name) = name {
            map.insert("name".into(), json!(name));
        }
        if let Some(s) = &self.schedule {
            map.insert("schedule".into(), json!(s));
        }
        if let Some(tz) = &self.tz {
            map.insert("timezone".into(), json!(tz));
        }
        if let Some(text) = &self.action {
            let action: Value = serde_json::from_str(text).context("--action is not JSON")?;
            map.insert("action".into(), action);
        }
        if let Some(url) = &self.url {
            map.insert("action".into(), webhook_action(url, &self.method));
        }
        if let Some(p) = self.priority {
            map.insert("priority".into(), json!(p));
        }
        if let Some(t) = &self.timeout {
            map.insert("timeout".into(), json!(t));
        }
        if let Some(r) = self.retries {
            map.insert("retries".into(), json!(r));
        }
        Ok(body)
    }
}

/// `kairos timers ...`
#[derive(Debug, Subcommand)]
pub enum TimersCommand {
    /// Check a schedule without a server: how it reads and when it fires next (the
    /// answer of POST /timers/validate).
    Check {
        /// A cron expression (`0 9 * * 1-5`, `@daily`) or times of day (`02:00 18:00`);
        /// omitted with --batch.
        #[arg(required_unless_present = "batch")]
        schedule: Option<String>,
        /// IANA zone the schedule is read in.
        #[arg(long, default_value = "UTC")]
        tz: String,
        /// Preview from this instant (RFC 3339, or `YYYY-MM-DD HH:MM:SS` in --tz) instead
        /// of now.
        #[arg(long)]
        from: Option<String>,
        /// How many fire times to show.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
        /// Read JSON lines `{"schedule", "timezone", "from_ms", "count"}` on stdin and
        /// answer each with a line `{"fires": [ms...]}` or `{"error": "..."}`.
        #[arg(long, conflicts_with = "schedule")]
        batch: bool,
        /// Same as `--output json`.
        #[arg(long, hide = true)]
        json: bool,
    },
    /// Create a timer (POST /timers): --schedule and an action (--url or --action) at
    /// least.
    Create {
        name: String,
        #[command(flatten)]
        fields: TimerFields,
        /// Create it deactivated.
        #[arg(long)]
        inactive: bool,
    },
    /// Change a timer (PATCH /timers/{name}): only the fields given.
    Edit {
        name: String,
        #[command(flatten)]
        fields: TimerFields,
        /// Move its next run to this time.
        #[arg(long)]
        next_run: Option<String>,
    },
    /// Delete a timer.
    #[command(visible_alias = "delete")]
    Rm {
        name: String,
    },
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
    /// Create a queue or replace its settings (PUT /queues/{name}).
    #[command(visible_alias = "put")]
    Create {
        name: String,
        /// Tasks started per second, across all hosts.
        #[arg(long)]
        rate: Option<f64>,
        /// Tasks that may start at once after a quiet spell.
        #[arg(long)]
        bucket_size: Option<u32>,
        /// Tasks running at once, across all hosts.
        #[arg(long)]
        max_concurrent: Option<u32>,
        /// The retry block as JSON: `{"limit": 5, "min_backoff": "1s", ...}`.
        #[arg(long)]
        retry: Option<String>,
        /// The whole body as JSON text (the flags above are added to it).
        #[arg(long)]
        json: Option<String>,
    },
    /// Delete a queue with its tasks.
    #[command(visible_alias = "delete")]
    Rm {
        name: String,
    },
    /// One queue with its settings and task counts.
    Show {
        name: String,
    },
    /// Pending tasks of a queue, or one of the task commands (`tasks add QUEUE ...`).
    #[command(args_conflicts_with_subcommands = true)]
    Tasks {
        /// The queue whose pending tasks to list.
        name: Option<String>,
        #[command(subcommand)]
        command: Option<TasksCommand>,
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
    /// Delete every task of a queue that is not running.
    Purge {
        name: String,
    },
}

/// `kairos queues tasks ...`
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// Pending tasks of a queue.
    Ls { queue: String },
    /// Add a task (or a list of at most 100): the body of POST /queues/{queue}/tasks from
    /// --json, a file or stdin; or a webhook task from --url.
    Add {
        queue: String,
        #[command(flatten)]
        body: Body,
        /// A webhook task calling this URL (or a path under the host's gateway).
        #[arg(long, conflicts_with_all = ["json", "file"])]
        url: Option<String>,
        /// The webhook's method, with --url.
        #[arg(long, requires = "url", default_value = "POST")]
        method: String,
        /// The task's name (unique in the queue), with --url.
        #[arg(long, requires = "url")]
        name: Option<String>,
        /// Run it this long from now (`90s`), with --url.
        #[arg(long, requires = "url")]
        countdown: Option<String>,
        /// Drop it, never run, if its first attempt cannot start this long after its
        /// time (`10m`), with --url.
        #[arg(long, requires = "url")]
        expire_after: Option<String>,
    },
    /// One task.
    Show { queue: String, task: String },
    /// Delete a task that is not running.
    #[command(visible_alias = "delete")]
    Rm { queue: String, task: String },
    /// Run a task now.
    Run { queue: String, task: String },
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

/// Waits for an uploaded version still compiling to be ready (at most two minutes);
/// its description then, or the reason it failed.
async fn wait_compiled(api: &Api, name: &str, uploaded: &Value) -> anyhow::Result<Value> {
    let version = uploaded["version"].clone();
    eprintln!("{name} version {version}: compiling on the server…");
    for _ in 0..240 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let shown = api.get(&format!("/plugins/{}", encode(name))).await?;
        let this = shown["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["version"] == version))
            .cloned()
            .unwrap_or(Value::Null);
        match this["state"].as_str() {
            Some("ready") => return Ok(this),
            Some("failed") => anyhow::bail!(
                "{name} version {version} cannot be used: {}",
                text(&this["error"])
            ),
            _ => {}
        }
    }
    anyhow::bail!("{name} version {version} is still compiling after two minutes (kairos plugins show {name})")
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

async fn plugins(api: &Api, command: PluginsCommand, output: Output) -> anyhow::Result<()> {
    match command {
        PluginsCommand::Ls => {
            let headers = [
                "NAME",
                "VERSION",
                "SIZE",
                "MEMORY",
                "TIMEOUT",
                "UPLOADED",
                "ALLOWED HOSTS",
            ];
            list_table(api, "/plugins", "plugins", output, &headers, |p| {
                let hosts: Vec<String> = p["allowed_hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                vec![
                    text(&p["name"]),
                    text(&p["version"]),
                    text(&p["size"]),
                    format!("{}Mi", text(&p["memory_mb"])),
                    format!("{}ms", text(&p["timeout_ms"])),
                    text(&p["uploaded_at"]),
                    if hosts.is_empty() {
                        "-".into()
                    } else {
                        hosts.join(",")
                    },
                ]
            })
            .await?;
        }
        PluginsCommand::Show { name } => emit(
            output,
            &api.get(&format!("/plugins/{}", encode(&name))).await?,
        ),
        PluginsCommand::Upload {
            name,
            file,
            allowed_hosts,
            memory_mb,
            timeout,
            no_wait,
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
            let mut meta = api
                .send(Method::PUT, &path, Some(bytes), "application/wasm")
                .await?;
            if meta["state"] == "compiling" && !no_wait {
                meta = wait_compiled(api, &name, &meta).await?;
            }
            emit(output, &meta);
        }
        PluginsCommand::Run {
            file,
            input,
            allow,
            memory_mb,
            timeout,
            request_timeout,
        } => {
            let limits = RunLimits {
                memory_mb,
                timeout,
                request_timeout,
            };
            run_plugin_file(file, input, allow, limits, output).await?
        }
        PluginsCommand::New { name, lang, dir } => {
            let project = new_plugin::write_project(&name, std::path::Path::new(&dir), &lang)?;
            println!(
                "wrote {0}/\nnext: cd {0} && {1} (see its README.md)",
                project.display(),
                new_plugin::next_steps(&lang)
            );
        }
        PluginsCommand::Delete { name, force } => {
            let path = format!(
                "/plugins/{}{}",
                encode(&name),
                if force { "?force=true" } else { "" }
            );
            emit(output, &api.call(Method::DELETE, &path, None).await?);
        }
    }
    Ok(())
}

/// The limits `kairos plugins run` is given, as typed.
struct RunLimits {
    memory_mb: u32,
    timeout: String,
    request_timeout: String,
}

/// `kairos plugins run`: see `plugins/local.rs`.
async fn run_plugin_file(
    file: String,
    input: String,
    allow: Vec<String>,
    limits: RunLimits,
    output: Output,
) -> anyhow::Result<()> {
    use crate::plugins::local::{run_once, LocalRun};
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {file}"))?;
    serde_json::from_str::<Value>(&input).map_err(|e| anyhow!("--input is not JSON: {e}"))?;
    let second = std::time::Duration::from_secs(1);
    let timeout = crate::config::parse_duration(&limits.timeout, second)
        .map_err(|e| anyhow!("--timeout: {e}"))?;
    let request_timeout = crate::config::parse_duration(&limits.request_timeout, second)
        .map_err(|e| anyhow!("--request-timeout: {e}"))?;
    let memory_mb = limits.memory_mb;
    if !(1..=1024).contains(&memory_mb) {
        bail!("--memory-mb must be 1 to 1024");
    }
    let name = std::path::Path::new(&file)
        .file_stem()
        .map(|s| s.to_string_lossy().replace('_', "-"))
        .unwrap_or_else(|| "local".into());
    let outcome = run_once(LocalRun {
        bytes,
        name: name.clone(),
        input,
        allow,
        memory_mb,
        timeout,
        request_timeout,
    })
    .await
    .map_err(|e| anyhow!("{file}: {e}"))?;
    let compile_ms = outcome.compile.as_secs_f64() * 1000.0;
    let run_ms = outcome.run.as_secs_f64() * 1000.0;
    let invocation = outcome.invocation;
    match output {
        Output::Json => print_json(&json!({
            "ok": invocation.result.is_ok(),
            "output": invocation.result.as_ref().ok(),
            "error": invocation.result.as_ref().err().map(|f| f.message(&name)),
            "retryable": invocation.result.as_ref().err().map(|f| f.retryable()),
            "logs": invocation.logs,
            "compile_ms": compile_ms,
            "compiled_from_cache": outcome.cached,
            "run_ms": run_ms,
        })),
        Output::Table => {
            for line in &invocation.logs {
                println!("log    {line}");
            }
            match &invocation.result {
                Ok(out) => println!("output {out}"),
                Err(f) => println!("error  {}", f.message(&name)),
            }
            let how = if outcome.cached {
                "loading it compiled from the cache"
            } else {
                "compiling first"
            };
            println!("took   {run_ms:.1} ms ({how}: {compile_ms:.0} ms)");
        }
    }
    match invocation.result {
        Ok(_) => Ok(()),
        Err(f) => Err(anyhow!(
            "the run failed{}",
            if f.retryable() {
                " (retryable: a firing would be retried)"
            } else {
                ""
            }
        )),
    }
}

async fn timers(api: &Api, command: Option<TimersCommand>, output: Output) -> anyhow::Result<()> {
    let timer = |name: &str, rest: &str| format!("/timers/{}{rest}", encode(name));
    let (method, path, body) = match command {
        None => {
            let headers = [
                "TIMER", "SCHEDULE", "TIMEZONE", "PRIO", "STATE", "NEXT RUN", "LAST", "ACTION",
            ];
            let fields = [
                "name",
                "schedule",
                "timezone",
                "priority",
                "state",
                "next_run",
                "last_outcome",
            ];
            return list_table(api, "/timers", "items", output, &headers, |t| {
                let mut row: Vec<String> = fields.iter().map(|k| text(&t[*k])).collect();
                row.push(action_summary(&t["action"]));
                row
            })
            .await;
        }
        Some(TimersCommand::Check { .. }) => unreachable!("answered without a server in run()"),
        Some(TimersCommand::Create {
            name,
            fields,
            inactive,
        }) => {
            let mut body = fields.body(Some(&name))?;
            if inactive {
                body["active"] = json!(false);
            }
            (Method::POST, "/timers".to_string(), Some(body))
        }
        Some(TimersCommand::Edit {
            name,
            fields,
            next_run,
        }) => {
            let mut body = fields.body(None)?;
            if let Some(at) = next_run {
                body["next_run"] = json!(at);
            }
            (Method::PATCH, timer(&name, ""), Some(body))
        }
        Some(TimersCommand::Rm { name }) => (Method::DELETE, timer(&name, ""), None),
        Some(TimersCommand::Show { name }) => {
            return show(api, &timer(&name, ""), output, summaries::timer).await
        }
        Some(TimersCommand::Runs { name }) => {
            return show(api, &timer(&name, "/runs"), output, summaries::timer_runs).await
        }
        Some(TimersCommand::Run { name }) => (Method::POST, timer(&name, "/run"), None),
        Some(TimersCommand::Activate { name }) => (Method::POST, timer(&name, "/activate"), None),
        Some(TimersCommand::Deactivate { name }) => {
            (Method::POST, timer(&name, "/deactivate"), None)
        }
    };
    let body = body.map(|b| serde_json::to_vec(&b).expect("JSON serializes"));
    emit(output, &api.call(method, &path, body).await?);
    Ok(())
}

async fn queues(api: &Api, command: Option<QueuesCommand>, output: Output) -> anyhow::Result<()> {
    let queue = |name: &str, rest: &str| format!("/queues/{}{rest}", encode(name));
    let (method, path, body) = match command {
        None => {
            let headers = [
                "QUEUE", "STATE", "RATE/S", "BUCKET", "MAX-CONC", "PENDING", "RUNNING", "FAILED",
            ];
            return list_table(api, "/queues", "items", output, &headers, |q| {
                vec![
                    text(&q["name"]),
                    text(&q["state"]),
                    text(&q["rate"]),
                    text(&q["bucket_size"]),
                    text(&q["max_concurrent"]),
                    text(&q["tasks"]["pending"]),
                    text(&q["tasks"]["running"]),
                    text(&q["tasks"]["failed"]),
                ]
            })
            .await;
        }
        Some(QueuesCommand::Create {
            name,
            rate,
            bucket_size,
            max_concurrent,
            retry,
            json,
        }) => {
            let mut body = json_object(json.as_deref())?;
            if let Some(r) = rate {
                body["rate"] = json!(r);
            }
            if let Some(b) = bucket_size {
                body["bucket_size"] = json!(b);
            }
            if let Some(m) = max_concurrent {
                body["max_concurrent"] = json!(m);
            }
            if let Some(text) = retry {
                body["retry"] = serde_json::from_str(&text).context("--retry is not JSON")?;
            }
            (Method::PUT, queue(&name, ""), Some(body))
        }
        Some(QueuesCommand::Rm { name }) => (Method::DELETE, queue(&name, ""), None),
        Some(QueuesCommand::Show { name }) => {
            return show(api, &queue(&name, ""), output, summaries::queue).await
        }
        Some(QueuesCommand::Tasks {
            name: Some(name), ..
        })
        | Some(QueuesCommand::Tasks {
            command: Some(TasksCommand::Ls { queue: name }),
            ..
        }) => return show(api, &queue(&name, "/tasks"), output, summaries::tasks).await,
        Some(QueuesCommand::Tasks {
            command: Some(task_command),
            ..
        }) => return tasks(api, task_command, output).await,
        Some(QueuesCommand::Tasks { .. }) => {
            bail!("name a queue (`kairos queues tasks QUEUE`) or a command (`tasks add QUEUE`)")
        }
        Some(QueuesCommand::Failed { name }) => {
            return show(api, &queue(&name, "/failed"), output, summaries::tasks).await
        }
        Some(QueuesCommand::Pause { name }) => (Method::POST, queue(&name, "/pause"), None),
        Some(QueuesCommand::Resume { name }) => (Method::POST, queue(&name, "/resume"), None),
        Some(QueuesCommand::Purge { name }) => (Method::POST, queue(&name, "/purge"), None),
    };
    let body = body.map(|b| serde_json::to_vec(&b).expect("JSON serializes"));
    emit(output, &api.call(method, &path, body).await?);
    Ok(())
}

/// GETs `path` and prints it with `summary`, or as the API's JSON.
async fn show(
    api: &Api,
    path: &str,
    output: Output,
    summary: fn(&Value) -> String,
) -> anyhow::Result<()> {
    let value = api.get(path).await?;
    match output {
        Output::Json => print_json(&value),
        Output::Table => print!("{}", summary(&value)),
    }
    Ok(())
}

async fn tasks(api: &Api, command: TasksCommand, output: Output) -> anyhow::Result<()> {
    let task = |queue: &str, name: &str, rest: &str| {
        format!("/queues/{}/tasks/{}{rest}", encode(queue), encode(name))
    };
    let (method, path, body) = match command {
        TasksCommand::Ls { .. } => unreachable!("listed by queues()"),
        TasksCommand::Add {
            queue,
            body,
            url,
            method,
            name,
            countdown,
            expire_after,
        } => {
            let body = match url {
                Some(url) => {
                    let mut task = json!({"action": webhook_action(&url, &method)});
                    if let Some(name) = name {
                        task["name"] = json!(name);
                    }
                    if let Some(countdown) = countdown {
                        task["countdown"] = json!(countdown);
                    }
                    if let Some(expire_after) = expire_after {
                        task["expire_after"] = json!(expire_after);
                    }
                    serde_json::to_vec(&task).expect("JSON serializes")
                }
                None => body.read(true)?.unwrap_or_default(),
            };
            (
                Method::POST,
                format!("/queues/{}/tasks", encode(&queue)),
                Some(body),
            )
        }
        TasksCommand::Show { queue, task: name } => {
            return show(api, &task(&queue, &name, ""), output, summaries::task).await
        }
        TasksCommand::Rm { queue, task: name } => (Method::DELETE, task(&queue, &name, ""), None),
        TasksCommand::Run { queue, task: name } => {
            (Method::POST, task(&queue, &name, "/run"), None)
        }
    };
    emit(output, &api.call(method, &path, body).await?);
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
