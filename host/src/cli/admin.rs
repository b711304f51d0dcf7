//! `kairos timers` and `kairos queues`: create, change, run, pause, show and list timers,
//! queues and their tasks.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use http::Method;
use serde_json::{json, Value};

use super::client::{encode, Api};
use super::print::{action_summary, emit, print_json, text, Output};
use super::{list_table, summaries, Body};

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

pub(super) async fn timers(
    api: &Api,
    command: Option<TimersCommand>,
    output: Output,
) -> anyhow::Result<()> {
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

pub(super) async fn queues(
    api: &Api,
    command: Option<QueuesCommand>,
    output: Output,
) -> anyhow::Result<()> {
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
