//! `kairos plugins`: list, show, upload (waiting for a large component's compile), delete,
//! and `plugins run`, a component file run once here with no server.

use anyhow::{anyhow, bail, Context};
use clap::Subcommand;
use http::Method;
use serde_json::{json, Value};

use super::client::{encode, query, Api};
use super::print::{emit, print_json, text, Output};
use super::{list_table, new_plugin};

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

pub(super) async fn plugins(
    api: &Api,
    command: PluginsCommand,
    output: Output,
) -> anyhow::Result<()> {
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
