//! `kairos plugins run FILE.wasm`: a component run once, from a file, in the sandbox a
//! firing uses (same engine, limits and outbound policy), with no Redis and no scheduler,
//! as `extism call` or `spin up` would: for plugin authors to try a build before they
//! upload it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::model::PlanKind;
use crate::outbound::{Knobs, OutboundPolicy, PolicyResolver};
use crate::plugins::{Invocation, InvokeContext, PluginMeta, PluginRuntime, RuntimeSettings};

/// What the run is given.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The component's bytes.
    pub bytes: Vec<u8>,
    /// The plugin's name in its context (the file's stem).
    pub name: String,
    pub input: String,
    /// Hosts it may call (`host` or `host:port`): the plugin's `allowed_hosts` and the
    /// host's `--allowed-hosts` both, as a test machine's targets are often loopback.
    pub allow: Vec<String>,
    pub memory_mb: u32,
    pub timeout: Duration,
    /// How long one outbound request may take (the host's `--request-timeout`).
    pub request_timeout: Duration,
}

/// What came of it.
#[derive(Debug)]
pub struct LocalOutcome {
    pub invocation: Invocation,
    /// Compiling and linking the component (a host does it once per upload and keeps
    /// the result on disk), or loading what an earlier run compiled.
    pub compile: Duration,
    /// Whether the compiled component came from the user's cache (an earlier run of the
    /// same file) rather than being compiled now.
    pub cached: bool,
    /// The run itself.
    pub run: Duration,
}

/// Runs the component once. Err: the file is no component kairos can run.
pub async fn run_once(run: LocalRun) -> Result<LocalOutcome, String> {
    let defaults = Config::default();
    let allowed =
        crate::config::parse_allowed_hosts(&run.allow.join(",")).map_err(|e| e.0.to_string())?;
    let policy = Arc::new(OutboundPolicy::new(allowed, None).with_knobs(Knobs::PluginsRun));
    let tls = crate::actions::webhook::tls_config(None)?;
    let client = |public_only| {
        crate::actions::webhook::pooled_client(
            tls.clone(),
            defaults.connect_timeout,
            PolicyResolver::new(policy.clone(), public_only),
        )
    };
    // Compiled code is loaded only from a directory of this user's own (made 0700 here,
    // before the runtime would make it); without one, every run compiles.
    let cache_dir = user_cache_dir();
    let private = private_dir(&cache_dir);
    let runtime = PluginRuntime::local(RuntimeSettings {
        instances: 1,
        // One run in its own process: no engine to keep apart from it.
        threads: 0,
        cache_dir,
        policy: policy.clone(),
        client: client(false),
        public_client: client(true),
        response_limit: defaults.response_body_limit,
        request_timeout: run.request_timeout,
        keep_resident: crate::plugins::runtime::DEFAULT_KEEP_RESIDENT,
        pagemap_scan: true,
    })
    .map_err(|e| format!("cannot start the plugin runtime: {e}"))?;
    let meta = PluginMeta {
        name: run.name.clone(),
        version: 0,
        digest: String::new(),
        size: run.bytes.len() as u64,
        allowed_hosts: run.allow.clone(),
        memory_mb: run.memory_mb,
        timeout_ms: run.timeout.as_millis().max(1) as u64,
        uploaded_at: String::new(),
        uploaded_at_ms: 0,
        input_schema: None,
        state: crate::plugins::registry::PluginState::Ready,
        error: None,
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let ctx = InvokeContext {
        life_id: format!("local-{now_ms}"),
        plan: PlanKind::Birth,
        scheduled_at_ms: now_ms,
        attempt: 1,
        resource_id: None,
        fence: Default::default(),
    };
    let began = Instant::now();
    let (pre, cached) = match private {
        true => runtime.prepare_cached(run.bytes).await?,
        false => (runtime.prepare(run.bytes).await?, false),
    };
    let compile = began.elapsed();
    // An input a booking would be refused for (400 invalid_input) is refused here too.
    let schema = runtime
        .input_schema(&pre, run.memory_mb, meta.timeout_ms)
        .await?;
    if let Some(text) = schema {
        let validator = crate::plugins::registry::compile_input_schema(&text)?;
        let input: serde_json::Value =
            serde_json::from_str(&run.input).map_err(|e| format!("--input is not JSON: {e}"))?;
        crate::plugins::registry::check_input(&validator, &input).map_err(|v| {
            format!(
                "{}; kairos refuses such a booking (400 invalid_input), so nothing ran",
                v.sentence("--input", &run.name)
            )
        })?;
    }
    let began = Instant::now();
    let invocation = runtime.run_traced(&pre, &meta, &ctx, &run.input).await;
    Ok(LocalOutcome {
        invocation,
        compile,
        cached,
        run: began.elapsed(),
    })
}

/// Where `plugins run` keeps compiled components: `$XDG_CACHE_HOME/kairos/plugin-cache`,
/// else `~/.cache/kairos/plugin-cache` (a large component, such as a Python one, then
/// compiles once, not at every run).
fn user_cache_dir() -> std::path::PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::env::temp_dir().join("kairos-no-cache"));
    base.join("kairos").join("plugin-cache")
}

/// Makes `dir` (mode 0700) if it is missing; true when it is a directory this user owns
/// that no one else may write to, so that what is loaded from it was written by this user.
fn private_dir(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir);
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    meta.is_dir() && meta.uid() == me && meta.permissions().mode() & 0o022 == 0
}
