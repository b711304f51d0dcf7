//! The WebAssembly runtime: one wasmtime engine per host, a pre-linked `ActionPre` per
//! plugin digest, a fresh store per invocation.
//!
//! - Compilation happens once per digest and host: at upload (to refuse what is not a
//!   fitting component) or on first use, after which the compiled artifact is kept in
//!   `{data_dir}/plugin-cache/` and later loads deserialize it (about 80 µs instead of
//!   tens of milliseconds). An upload of bytes the host holds prepared, or finds in that
//!   cache (another name, an upload before a restart), compiles nothing.
//! - The pooling allocator keeps instance slots warm; `workers` slots, since a host runs
//!   at most that many actions at once.
//! - A run is bounded by its plugin's `timeout` in wall time: epoch interruption makes a
//!   spinning guest yield every tick, and a tokio timeout drops the call when the time is
//!   up, whether the guest computes or waits on HTTP. Memory is capped by store limits
//!   (`memory_mb`), with a trap on a refused grow.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, Semaphore};
use wasmtime::component::{Component, HasSelf, Linker, WasmStr};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

use super::bindings::kairos::plugin0_1_0::types as wit;
use super::bindings::ActionPre;
use super::registry::{PluginMeta, PluginState, Registry};
use super::sandbox::{LogSink, Outbound, PluginClient, Sandbox, MAX_LOG_BYTES};
use crate::actions::Fence;
use crate::bookings::Bookings;
use crate::config::AllowedHost;
use crate::model::PlanKind;
use crate::outbound::OutboundPolicy;

/// How often a host looks for new plugin versions to prepare.
const WARM_EVERY: Duration = Duration::from_secs(1);
/// A version compiling for longer than this was left so by an uploading host that
/// stopped: any host that fails to compile it records the failure.
const STALLED_COMPILE_MS: i64 = 120_000;
/// How often the epoch advances; a spinning guest yields this often.
const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The largest `memory_mb` an upload may ask for.
pub const MAX_MEMORY_MB: u32 = 1024;
/// Output kept in history, and bytes of a plugin's error message.
const MAX_OUTPUT_BYTES: usize = 4096;
/// The most bytes one value passed from a plugin to the host may have (wasmtime's
/// "hostcall fuel", 128 MiB by default): above the REST body limit a booking may have,
/// far below what would strain the host.
pub const HOSTCALL_FUEL: usize = 16 << 20;

/// Components kept pre-linked in memory.
pub const MAX_RESIDENT_COMPONENTS: usize = 64;
/// Compiled artifacts kept in the disk cache, and their total size: past either, the
/// least recently used files go.
pub const MAX_CACHED_ARTIFACTS: usize = 256;
pub const MAX_CACHED_BYTES: u64 = 2 << 30;

/// The in-memory components: by digest, with when each was last used.
/// A digest's component, filled once on first use.
type Slot = Arc<OnceCell<ActionPre<Sandbox>>>;

#[derive(Default)]
struct Resident {
    by_digest: HashMap<String, (Slot, u64)>,
    uses: u64,
}

impl Resident {
    fn get(&mut self, digest: &str) -> Slot {
        self.uses += 1;
        let uses = self.uses;
        if let Some((cell, used)) = self.by_digest.get_mut(digest) {
            *used = uses;
            return cell.clone();
        }
        if self.by_digest.len() >= MAX_RESIDENT_COMPONENTS {
            let oldest = self
                .by_digest
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(d, _)| d.clone());
            if let Some(oldest) = oldest {
                self.by_digest.remove(&oldest);
            }
        }
        let cell = Arc::new(OnceCell::new());
        self.by_digest
            .insert(digest.to_string(), (cell.clone(), uses));
        cell
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_digest.len()
    }
}

/// Removes the least recently used artifacts of the disk cache beyond
/// [`MAX_CACHED_ARTIFACTS`] files or [`MAX_CACHED_BYTES`] bytes.
fn prune_cache(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            if !meta.is_file() {
                return None;
            }
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut kept_bytes = 0u64;
    for (i, (_, len, path)) in files.iter().enumerate() {
        kept_bytes += len;
        if i >= MAX_CACHED_ARTIFACTS || kept_bytes > MAX_CACHED_BYTES {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What the runtime needs from the host's configuration.
pub struct RuntimeSettings {
    pub instances: u32,
    /// Threads of the pool that runs plugin code (see [`PluginPool`]); 0: on the
    /// caller's own threads.
    pub threads: usize,
    pub cache_dir: PathBuf,
    pub policy: Arc<OutboundPolicy>,
    /// For targets the plugin's own `allowed_hosts` names.
    pub client: PluginClient,
    /// For targets it reaches only through `*`: public addresses only, when connecting.
    pub public_client: PluginClient,
    pub response_limit: usize,
    pub request_timeout: Duration,
    /// Bytes of each linear memory and table the pool resets in place instead of
    /// returning to the kernel; see `engine_config`.
    pub keep_resident: usize,
    /// Find the pages a run dirtied with Linux's PAGEMAP_SCAN (6.7+) and reset only
    /// those; falls back to plain memset + madvise on older kernels.
    pub pagemap_scan: bool,
}

/// The measured best `keep_resident` on the 2-core machine (BENCHMARKS.md).
pub const DEFAULT_KEEP_RESIDENT: usize = 256 << 10;

/// The threads plugin code runs on: a tokio runtime of their own, apart from the one
/// that claims, starts and finishes runs and calls webhooks, its threads at a lower CPU
/// priority (nice 10). A guest that spins yields at every epoch tick (10 ms) to the
/// other plugin runs of its pool, never to the engine's tasks, so a tenant's busy
/// plugins can slow other plugins but cannot make webhook Plans late.
struct PluginPool {
    handle: tokio::runtime::Handle,
    /// Dropped with the runtime of plugins: the pool's thread then shuts the pool down.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The CPU priority of a plugin thread (a nice value: higher is lower priority).
const PLUGIN_THREAD_NICE: libc::c_int = 10;

impl PluginPool {
    fn start(threads: usize) -> anyhow::Result<PluginPool> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kairos-plugin-pool".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    // A guest that spins yields at every epoch tick (10 ms), each a
                    // scheduler tick: by default timers and sockets would be looked at
                    // only every 61 of them (over half a second), and other plugins'
                    // responses and deadlines would wait that long.
                    .event_interval(1)
                    .thread_name("kairos-plugin")
                    .on_thread_start(|| {
                        // On Linux the nice value is a thread's own: this lowers only
                        // the pool's threads. Failure leaves them at normal priority.
                        // SAFETY: setpriority reads no memory of ours.
                        unsafe {
                            libc::setpriority(libc::PRIO_PROCESS, 0, PLUGIN_THREAD_NICE);
                        }
                    })
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = ready_tx.send(Ok(runtime.handle().clone()));
                        runtime.block_on(async {
                            let _ = stopped.await;
                        });
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })?;
        let handle = ready
            .recv()
            .map_err(|_| anyhow::anyhow!("the plugin pool's thread ended at once"))??;
        Ok(PluginPool {
            handle,
            _stop: stop,
        })
    }
}

/// Aborts a task of the plugin pool when the run waiting for it is dropped (a timer's
/// `overlap: cancel_running`, a host shutting down), as dropping the call would if it
/// ran in place.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The firing that runs a plugin.
#[derive(Debug, Clone)]
pub struct InvokeContext {
    pub life_id: String,
    pub plan: PlanKind,
    pub scheduled_at_ms: i64,
    pub attempt: u32,
    pub resource_id: Option<String>,
    /// Asked before each of the run's requests (see [`Fence`]).
    pub fence: Fence,
}

/// Why an invocation did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The plugin returned an error.
    Plugin { message: String, retryable: bool },
    /// The guest trapped (memory cap, stack overflow...).
    Trap(String),
    /// The guest panicked (a Rust `panic!`: a trap whose message it wrote to stderr):
    /// where and what it said.
    Panic(String),
    /// The wall-time deadline passed.
    Timeout(u64),
    /// The plugin could not be found or compiled.
    Setup(String),
    /// Redis could not be read: worth a retry.
    Unavailable(String),
}

impl Failure {
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Failure::Plugin {
                retryable: true,
                ..
            } | Failure::Unavailable(_)
        )
    }

    pub fn message(&self, plugin: &str) -> String {
        match self {
            Failure::Plugin { message, .. } => format!("plugin {plugin}: {message}"),
            Failure::Trap(trap) => format!("plugin {plugin} trapped: {trap}"),
            Failure::Panic(what) => format!("plugin {plugin} panicked at {what}"),
            Failure::Timeout(ms) => {
                format!("plugin {plugin} ran past its {ms} ms deadline and was stopped")
            }
            Failure::Setup(why) | Failure::Unavailable(why) => format!("plugin {plugin}: {why}"),
        }
    }
}

/// Makes a failure say what the run's logs know: a trap that a Rust panic caused is a
/// panic, with its place and message (and the panic's hint to set RUST_BACKTRACE,
/// which cannot apply in the sandbox, is dropped from the logs); a plugin error after a
/// request the host denied names the list that denied it (the guest only learns that
/// its request was denied, not why).
fn explain(failure: Failure, logs: &mut Vec<String>) -> Failure {
    logs.retain(|line| !(line.starts_with("stderr: note: run with `RUST_BACKTRACE")));
    match failure {
        Failure::Trap(trap) => {
            let panic = logs
                .iter()
                .position(|line| line.starts_with("stderr: ") && line.contains(" panicked at "));
            let Some(at) = panic else {
                return Failure::Trap(trap);
            };
            let place = logs[at]
                .split_once(" panicked at ")
                .map(|(_, place)| place.trim_end_matches(':'))
                .unwrap_or("");
            let message = logs
                .get(at + 1)
                .and_then(|line| line.strip_prefix("stderr: "))
                .unwrap_or(&trap);
            Failure::Panic(prefix(&format!("{place}: {message}"), MAX_OUTPUT_BYTES).to_string())
        }
        Failure::Plugin { message, retryable } => {
            let denial = logs
                .iter()
                .find_map(|line| line.strip_prefix("denied: outbound policy: "));
            match denial {
                Some(why) if !message.contains(why) => Failure::Plugin {
                    message: prefix(&format!("{message} (denied: {why})"), MAX_OUTPUT_BYTES)
                        .to_string(),
                    retryable,
                },
                _ => Failure::Plugin { message, retryable },
            }
        }
        other => other,
    }
}

/// The outcome of one invocation, with what it logged.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The JSON text the plugin returned (at most 4 KiB of it), or why it failed.
    pub result: Result<String, Failure>,
    pub logs: Vec<String>,
    /// A request of the run was not sent because the host's lease lapsed.
    pub fenced: bool,
}

/// Runs plugins.
pub struct PluginRuntime {
    engine: Engine,
    linker: Linker<Sandbox>,
    /// None in a runtime made by [`PluginRuntime::local`] (`kairos plugins run`), which
    /// runs components from files, with no Redis and no scheduler.
    registry: Option<Registry>,
    bookings: Option<Arc<Bookings>>,
    settings: RuntimeSettings,
    /// Pre-linked components by digest; filled once per digest even under concurrent
    /// first uses. At most [`MAX_RESIDENT_COMPONENTS`], the least recently used going
    /// first (a run under way keeps its own reference).
    loaded: Mutex<Resident>,
    /// One slot per pooled instance.
    slots: Arc<Semaphore>,
    /// Parsed `allowed_hosts` by plugin digest and list.
    allowed: Mutex<HashMap<String, Arc<Vec<AllowedHost>>>>,
    /// Where runs of [`invoke_pooled`](PluginRuntime::invoke_pooled) go (None: in place).
    pool: Option<PluginPool>,
}

/// The engine configuration every host uses; also what compiled artifacts must match.
fn engine_config(instances: u32, keep_resident: usize, pagemap_scan: bool) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        // A Rust component has a handful of core instances and tables, one memory; a
        // componentize-py (Python) one instantiates 14 core modules (CPython, libc and
        // their shims, linked dynamically) with two tables. A core instance slot is
        // bookkeeping only (no memory is reserved for it), so allow 32.
        .total_core_instances(instances * 32)
        .total_memories(instances * 2)
        .total_tables(instances * 8)
        .total_stacks(instances)
        .max_memory_size(MAX_MEMORY_MB as usize * 1024 * 1024)
        // Resetting the first bytes of a slot in place (memset) instead of madvise +
        // page faults on reuse: those take the process-wide mmap lock and shoot down
        // TLBs on every core, which serialises concurrent invocations.
        .linear_memory_keep_resident(keep_resident)
        .table_keep_resident(64 * 1024)
        .async_stack_keep_resident(keep_resident.min(256 * 1024))
        .pagemap_scan(if pagemap_scan {
            wasmtime::Enabled::Auto
        } else {
            wasmtime::Enabled::No
        });
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

impl PluginRuntime {
    pub fn new(
        registry: Registry,
        bookings: Arc<Bookings>,
        settings: RuntimeSettings,
    ) -> anyhow::Result<Arc<PluginRuntime>> {
        Self::build(Some(registry), Some(bookings), settings)
    }

    /// A runtime for `kairos plugins run`: components come from files ([`run_file`]),
    /// and `schedule.book`/`cancel` answer `no_scheduler`.
    ///
    /// [`run_file`]: PluginRuntime::run_file
    pub fn local(settings: RuntimeSettings) -> anyhow::Result<Arc<PluginRuntime>> {
        Self::build(None, None, settings)
    }

    fn build(
        registry: Option<Registry>,
        bookings: Option<Arc<Bookings>>,
        settings: RuntimeSettings,
    ) -> anyhow::Result<Arc<PluginRuntime>> {
        let engine = Engine::new(&engine_config(
            settings.instances,
            settings.keep_resident,
            settings.pagemap_scan,
        ))
        .map_err(|e| anyhow::anyhow!("wasmtime engine: {e}"))?;
        let mut linker = Linker::<Sandbox>::new(&engine);
        let link = |r: wasmtime::Result<()>| r.map_err(|e| anyhow::anyhow!("linking: {e}"));
        link(wasmtime_wasi::p2::add_to_linker_async(&mut linker))?;
        link(wasmtime_wasi_http::p2::add_only_http_to_linker_async(
            &mut linker,
        ))?;
        use super::bindings::kairos::plugin0_1_0::{log, schedule};
        link(wit::add_to_linker::<_, HasSelf<Sandbox>>(
            &mut linker,
            |s| s,
        ))?;
        // `log` is linked by hand, not through the generated bindings, so that a line is
        // read from the guest's memory only up to what the run's log keeps: a plugin
        // cannot make the host copy a gigabyte to drop it.
        link(
            linker
                .instance("kairos:plugin/log@0.1.0")
                .and_then(|mut log| {
                    log.func_wrap(
                        "log",
                        |mut store: wasmtime::StoreContextMut<'_, Sandbox>,
                         (level, message): (log::Level, WasmStr)| {
                            let line = {
                                let text = message.to_str(&store)?;
                                format!("{}: {}", level_name(level), prefix(&text, MAX_LOG_BYTES))
                            };
                            store.data_mut().logs.push(line);
                            Ok(())
                        },
                    )
                }),
        )?;
        link(schedule::add_to_linker::<_, HasSelf<Sandbox>>(
            &mut linker,
            |s| s,
        ))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("kairos-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        std::fs::create_dir_all(&settings.cache_dir)
            .map_err(|e| anyhow::anyhow!("plugin cache {}: {e}", settings.cache_dir.display()))?;
        let slots = Arc::new(Semaphore::new(settings.instances as usize));
        let pool = match settings.threads {
            0 => None,
            threads => Some(PluginPool::start(threads)?),
        };
        Ok(Arc::new(PluginRuntime {
            pool,
            engine,
            linker,
            registry,
            bookings,
            settings,
            loaded: Mutex::new(Resident::default()),
            slots,
            allowed: Mutex::new(HashMap::new()),
        }))
    }

    /// The registry of a serving host's runtime.
    ///
    /// # Panics
    /// On a runtime made by [`PluginRuntime::local`], which has none and is never handed
    /// to the API or the engine.
    pub fn registry(&self) -> &Registry {
        self.registry
            .as_ref()
            .expect("a serving host's plugin runtime has a registry")
    }

    /// Compiles and links the component in `bytes` for [`run_traced`]. For `kairos
    /// plugins run`.
    ///
    /// [`run_traced`]: PluginRuntime::run_traced
    pub async fn prepare(&self, bytes: Vec<u8>) -> Result<ActionPre<Sandbox>, String> {
        let component = self.compile(bytes, None).await?;
        self.prelink(&component)
    }

    /// Compiles a component on a blocking thread, and keeps the artifact in the disk
    /// cache at `cache` when given. The one place kairos compiles; the error is a
    /// sentence for whoever gave the bytes.
    async fn compile(&self, bytes: Vec<u8>, cache: Option<PathBuf>) -> Result<Component, String> {
        if !bytes.starts_with(b"\0asm") {
            return Err("not a WebAssembly binary (it does not start with \\0asm): give the .wasm file cargo builds for wasm32-wasip2".into());
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || {
            let component = Component::new(&engine, &bytes)?;
            if let Some(path) = cache {
                write_artifact(&path, &component);
            }
            Ok::<_, wasmtime::Error>(component)
        })
        .await
        .map_err(|e| format!("compilation did not finish: {e}"))?
        .map_err(|e| format!("not a valid WebAssembly component: {}", root(&e)))
    }

    /// Runs a prepared component once, as a firing would (same engine, sandbox and the
    /// limits in `meta`), and logs every outbound request with its answer.
    pub async fn run_traced(
        &self,
        pre: &ActionPre<Sandbox>,
        meta: &PluginMeta,
        ctx: &InvokeContext,
        input: &str,
    ) -> Invocation {
        self.invoke_pre(pre, meta, ctx, input, true).await
    }

    /// Compiles and links `bytes` (whose digest is `digest`) the way a firing would, so
    /// that an upload that could never run is refused at once, and asks the component
    /// for its input schema with the upload's limits. Returns the error as a sentence.
    ///
    /// Compiled code is reused by digest: bytes this host holds prepared already, or
    /// whose artifact is in its disk cache (the same bytes uploaded under another name,
    /// or again after a restart), are not compiled again. What is compiled here is kept
    /// prepared under the digest before the upload is registered, so that its first
    /// firing runs at once and the warm-up that the registration starts waits for it
    /// rather than compiling it a second time; its artifact goes to the disk cache in the
    /// background, not delaying the answer.
    pub async fn check(
        &self,
        digest: &str,
        bytes: Vec<u8>,
        memory_mb: u32,
        timeout_ms: u64,
    ) -> Result<Compiled, String> {
        let cell = self.loaded.lock().expect("plugin cache").get(digest);
        let mut how = Prepared::Resident;
        let pre = cell
            .get_or_try_init(|| async {
                if let Some(component) = self.read_cached(digest).await {
                    how = Prepared::FromDiskCache;
                    return self.prelink(&component);
                }
                how = Prepared::Compiled;
                let component = self.compile(bytes, None).await?;
                let pre = self.prelink(&component)?;
                let path = self.cache_path(digest);
                tokio::task::spawn_blocking(move || write_artifact(&path, &component));
                Ok::<_, String>(pre)
            })
            .await?
            .clone();
        let input_schema = self.input_schema(&pre, memory_mb, timeout_ms).await?;
        Ok(Compiled { input_schema, how })
    }

    fn prelink(&self, component: &Component) -> Result<ActionPre<Sandbox>, String> {
        let pre = self.linker.instantiate_pre(component).map_err(|e| {
            format!(
                "the component needs what kairos does not give plugins: {}",
                root(&e)
            )
        })?;
        ActionPre::new(pre).map_err(|e| {
            format!(
                "the component does not target the kairos:plugin/action world: {}",
                root(&e)
            )
        })
    }

    fn cache_path(&self, digest: &str) -> PathBuf {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        self.settings
            .cache_dir
            .join(format!("{digest}-{:016x}.cwasm", hasher.finish()))
    }

    /// Keeps every plugin's latest version ready on this host, so that its first firing
    /// here costs what later ones do: at startup, and within `WARM_EVERY` of an upload on
    /// any host (it watches the registry's version counters), it loads each latest
    /// version: from the disk cache when this host compiled it before, else from Redis,
    /// compiled and cached. At most [`MAX_RESIDENT_COMPONENTS`] plugins are kept warm.
    pub async fn keep_warm(self: Arc<Self>, mut shutdown: crate::engine::ShutdownSignal) {
        let mut seen = None;
        // While a version is still compiling (its uploader may have stopped), the pass
        // is made again now and then even with no new upload.
        let mut compiling_since: Option<std::time::Instant> = None;
        loop {
            match self.registry().version_counters().await {
                Ok(counters)
                    if Some(&counters) != seen.as_ref()
                        || compiling_since.is_some_and(|at| {
                            at.elapsed() > Duration::from_millis(STALLED_COMPILE_MS as u64 / 2)
                        }) =>
                {
                    let compiling = self.warm_latest().await;
                    compiling_since = compiling.then(std::time::Instant::now);
                    seen = Some(counters);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e.message, "cannot read the plugin registry"),
            }
            tokio::select! {
                _ = tokio::time::sleep(WARM_EVERY) => {}
                _ = crate::engine::until_shutdown(&mut shutdown) => return,
            }
        }
    }

    /// Loads the latest version of every plugin (the newest uploads first), and ends the
    /// compile of those still compiling; true when one still is.
    async fn warm_latest(&self) -> bool {
        let mut latest = match self.registry().list().await {
            Ok(list) => list,
            Err(e) => {
                tracing::debug!(error = %e.message, "cannot list the plugins to warm");
                return false;
            }
        };
        // Versions still compiling behind a newer upload are ended too.
        match self.registry().compiling_behind().await {
            Ok(behind) => latest.extend(behind),
            Err(e) => {
                tracing::debug!(error = %e.message, "cannot read the versions still compiling")
            }
        }
        latest.sort_by_key(|m| std::cmp::Reverse(m.uploaded_at_ms));
        let mut still_compiling = false;
        for meta in latest.iter().take(MAX_RESIDENT_COMPONENTS) {
            match meta.state {
                PluginState::Failed => continue,
                PluginState::Compiling => {
                    still_compiling |= !self.finish_compile(meta).await;
                    continue;
                }
                PluginState::Ready => {}
            }
            let started = std::time::Instant::now();
            match self.load(&meta.digest).await {
                Ok(_) => tracing::info!(
                    plugin = %meta.name,
                    version = meta.version,
                    digest = %meta.digest,
                    ms = started.elapsed().as_millis() as u64,
                    "plugin ready"
                ),
                Err(e) => tracing::warn!(
                    plugin = %meta.name,
                    version = meta.version,
                    error = %e.message(&meta.name),
                    "cannot prepare a plugin; its first run will try again"
                ),
            }
        }
        still_compiling
    }

    /// Compiles a version registered `compiling` and ends it (ready with its input
    /// schema, or failed): the uploading host does so when its compile ends, and every
    /// host that warms it does the same, so that a version whose uploading host stopped
    /// meanwhile is ended all the same. Whichever ends it first writes it. True when it
    /// is ended (here or elsewhere), false when it is left compiling.
    async fn finish_compile(&self, meta: &PluginMeta) -> bool {
        let bytes = match self.registry().bytes(&meta.digest).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return true,
            Err(e) => {
                tracing::debug!(plugin = %meta.name, error = %e.message, "cannot read a plugin to compile");
                return false;
            }
        };
        let outcome = self
            .check(&meta.digest, bytes, meta.memory_mb, meta.timeout_ms)
            .await
            .map(|c| c.input_schema);
        // A failure here may be this host's alone (its input-schema call timed out on a
        // loaded machine): the uploading host records failures; another host does only
        // once the version has been compiling for long enough that its uploader has
        // surely stopped.
        let stalled =
            chrono::Utc::now().timestamp_millis() - meta.uploaded_at_ms > STALLED_COMPILE_MS;
        if let (Err(why), false) = (&outcome, stalled) {
            tracing::debug!(plugin = %meta.name, version = meta.version, error = %why, "a plugin failed to compile here; its uploading host records it");
            return false;
        }
        let written = self
            .registry()
            .promote(
                &meta.name,
                meta.version,
                &meta.digest,
                outcome
                    .as_ref()
                    .map(|s| s.as_deref())
                    .map_err(String::as_str),
            )
            .await;
        match written {
            Ok(true) => {
                tracing::info!(plugin = %meta.name, version = meta.version, ready = outcome.is_ok(), "plugin compile ended here");
                true
            }
            Ok(false) => true,
            Err(e) => {
                tracing::debug!(plugin = %meta.name, error = %e.message, "cannot record a plugin's compile");
                false
            }
        }
    }

    /// The pre-linked component of a digest: from memory, the disk cache, or Redis.
    async fn load(&self, digest: &str) -> Result<ActionPre<Sandbox>, Failure> {
        let cell = self.loaded.lock().expect("plugin cache").get(digest);
        cell.get_or_try_init(|| self.load_uncached(digest))
            .await
            .cloned()
    }

    /// The compiled artifact of a digest from the disk cache, if it is there and whole.
    async fn read_cached(&self, digest: &str) -> Option<Component> {
        let path = self.cache_path(digest);
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::read(&path).ok()?;
            let artifact = checked_artifact(&file)?;
            // Marks it recently used, for the cache's pruning.
            if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            // SAFETY: the bytes are, checksum verified, what an engine with this
            // compatibility hash serialized (write_artifact) into a directory only this
            // user writes (the host's data directory, or `plugins run`'s private cache);
            // deserialize also checks the engine settings they were made with. Without
            // the checksum a damaged file that still parses would run as machine code.
            unsafe { Component::deserialize(&engine, artifact) }.ok()
        })
        .await
        .ok()
        .flatten()
    }

    /// `prepare`, through the disk cache: a component compiled before (same digest, same
    /// engine) is loaded instead of compiled again. Also says whether it came from there.
    pub async fn prepare_cached(
        &self,
        bytes: Vec<u8>,
    ) -> Result<(ActionPre<Sandbox>, bool), String> {
        let digest = super::registry::digest_of(&bytes);
        if let Some(component) = self.read_cached(&digest).await {
            return Ok((self.prelink(&component)?, true));
        }
        let component = self.compile(bytes, Some(self.cache_path(&digest))).await?;
        Ok((self.prelink(&component)?, false))
    }

    async fn load_uncached(&self, digest: &str) -> Result<ActionPre<Sandbox>, Failure> {
        let cached = self.read_cached(digest).await;
        let component = match cached {
            Some(c) => c,
            None => {
                let bytes = self
                    .registry()
                    .bytes(digest)
                    .await
                    .map_err(|e| {
                        Failure::Unavailable(format!("cannot read the component: {}", e.message))
                    })?
                    .ok_or_else(|| {
                        Failure::Setup("its component bytes are gone from Redis".to_string())
                    })?;
                self.compile(bytes, Some(self.cache_path(digest)))
                    .await
                    .map_err(Failure::Setup)?
            }
        };
        self.prelink(&component).map_err(Failure::Setup)
    }

    fn allowed_hosts(&self, meta: &PluginMeta) -> Arc<Vec<AllowedHost>> {
        let key = meta.allowed_hosts.join(",");
        self.allowed
            .lock()
            .expect("allowed hosts cache")
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(crate::config::parse_allowed_hosts(&key).unwrap_or_default())
            })
            .clone()
    }

    /// [`invoke`](Self::invoke) on the plugin pool's threads (see [`PluginPool`]); the
    /// run is aborted if the returned future is dropped.
    pub async fn invoke_pooled(
        self: &Arc<Self>,
        spec: String,
        ctx: InvokeContext,
        input: String,
        timeout_ms: Option<u64>,
    ) -> Invocation {
        let runtime = self.clone();
        let run = async move { runtime.invoke(&spec, &ctx, &input, timeout_ms).await };
        let Some(pool) = &self.pool else {
            return run.await;
        };
        let mut task = AbortOnDrop(pool.handle.spawn(run));
        match (&mut task.0).await {
            Ok(invocation) => invocation,
            Err(e) => Invocation {
                result: Err(Failure::Setup(format!("the plugin's run ended early: {e}"))),
                logs: Vec::new(),
                fenced: false,
            },
        }
    }

    /// Runs `spec` (`name` or `name@version`) for one firing.
    /// `timeout_ms` is the booking's own limit, when it set one; the plugin's applies
    /// otherwise, and the shorter of the two when both do.
    pub async fn invoke(
        &self,
        spec: &str,
        ctx: &InvokeContext,
        input: &str,
        timeout_ms: Option<u64>,
    ) -> Invocation {
        let failed = |failure: Failure| Invocation {
            result: Err(failure),
            logs: Vec::new(),
            fenced: false,
        };
        let mut meta = match self.registry().resolve(spec).await {
            Ok(Some(meta)) => meta,
            Ok(None) => return failed(Failure::Setup(format!("no plugin `{spec}` is registered"))),
            Err(e) => {
                return failed(Failure::Unavailable(format!(
                    "cannot read the registry: {}",
                    e.message
                )))
            }
        };
        let pre = match self.load(&meta.digest).await {
            Ok(pre) => pre,
            Err(failure) => return failed(failure),
        };
        if let Some(t) = timeout_ms {
            meta.timeout_ms = meta.timeout_ms.min(t.max(1));
        }
        self.invoke_loaded(&pre, &meta, ctx, input).await
    }

    /// Runs an already loaded plugin: fresh store, instantiate, call, drop.
    pub async fn invoke_loaded(
        &self,
        pre: &ActionPre<Sandbox>,
        meta: &PluginMeta,
        ctx: &InvokeContext,
        input: &str,
    ) -> Invocation {
        self.invoke_pre(pre, meta, ctx, input, false).await
    }

    /// One run; `trace` logs every outbound request, not only refusals.
    async fn invoke_pre(
        &self,
        pre: &ActionPre<Sandbox>,
        meta: &PluginMeta,
        ctx: &InvokeContext,
        input: &str,
        trace: bool,
    ) -> Invocation {
        let wit_ctx = wit::Context {
            life_id: ctx.life_id.clone(),
            plan: match ctx.plan {
                PlanKind::Birth => wit::PlanKind::Birth,
                PlanKind::Death => wit::PlanKind::Death,
            },
            scheduled_at_ms: ctx.scheduled_at_ms,
            attempt: ctx.attempt,
            resource_id: ctx.resource_id.clone(),
            plugin_name: meta.name.clone(),
            plugin_version: meta.version,
        };
        let (result, mut logs, fenced) = self
            .call_export(pre, meta, &ctx.fence, trace, Export::Run(wit_ctx, input))
            .await;
        let result = match result {
            Ok(Answer::Run(Ok(output))) => Ok(output),
            Ok(Answer::Run(Err((message, retryable)))) => {
                Err(Failure::Plugin { message, retryable })
            }
            Ok(Answer::InputSchema(_)) => unreachable!("a run answers as a run"),
            Err(failure) => Err(failure),
        };
        let result = result.map_err(|failure| explain(failure, &mut logs));
        Invocation {
            result,
            logs,
            fenced,
        }
    }

    /// The input schema a prepared component declares (its WIT 0.2 `input-schema`
    /// export; None for a 0.1 component or one that declares none), asked in the
    /// sandbox with the upload's memory and time limits (at most 5 s), and checked as
    /// JSON Schema.
    /// The error is a sentence for the uploader.
    pub async fn input_schema(
        &self,
        pre: &ActionPre<Sandbox>,
        memory_mb: u32,
        timeout_ms: u64,
    ) -> Result<Option<String>, String> {
        let meta = PluginMeta {
            name: "upload".into(),
            version: 0,
            digest: String::new(),
            size: 0,
            allowed_hosts: Vec::new(),
            memory_mb,
            timeout_ms: timeout_ms.min(INPUT_SCHEMA_TIMEOUT_MS),
            uploaded_at: String::new(),
            uploaded_at_ms: 0,
            input_schema: None,
            state: PluginState::Ready,
            error: None,
        };
        let (result, mut logs, _) = self
            .call_export(pre, &meta, &Fence::default(), false, Export::InputSchema)
            .await;
        let schema = match result {
            Ok(Answer::InputSchema(schema)) => schema,
            Ok(Answer::Run(_)) => unreachable!("input-schema answers as input-schema"),
            Err(failure) => {
                return Err(format!(
                    "its input-schema export failed: {}",
                    explain(failure, &mut logs).message("upload")
                ))
            }
        };
        let Some(text) = schema else { return Ok(None) };
        if text.len() > MAX_INPUT_SCHEMA_BYTES {
            return Err(format!(
                "its input-schema is {} bytes, more than the {MAX_INPUT_SCHEMA_BYTES} allowed",
                text.len()
            ));
        }
        super::registry::compile_input_schema(&text)?;
        Ok(Some(text))
    }

    /// Calls one export of `pre` in a fresh sandboxed store with `meta`'s limits; the
    /// answer (or why there is none), the run's logs, and whether its fence stopped a
    /// request.
    async fn call_export(
        &self,
        pre: &ActionPre<Sandbox>,
        meta: &PluginMeta,
        fence: &Fence,
        trace: bool,
        export: Export<'_>,
    ) -> (Result<Answer, Failure>, Vec<String>, bool) {
        let _slot = self.slots.acquire().await.expect("slots never close");
        let logs = LogSink::default();
        let outbound = Outbound {
            policy: self.settings.policy.clone(),
            allowed: self.allowed_hosts(meta),
            client: self.settings.client.clone(),
            public_client: self.settings.public_client.clone(),
            response_limit: self.settings.response_limit,
            request_timeout: self.settings.request_timeout,
            logs: logs.clone(),
            in_flight: Outbound::in_flight_places(),
            trace,
            fence: fence.clone(),
            fenced: Arc::new(AtomicBool::new(false)),
        };
        let fenced = outbound.fenced.clone();
        let memory = meta.memory_mb.min(MAX_MEMORY_MB) as usize * 1024 * 1024;
        let mut store = Store::new(
            &self.engine,
            Sandbox::new(outbound, memory, self.bookings.clone(), meta.name.clone()),
        );
        store.limiter(|s| &mut s.limits);
        // The most one value may carry from the plugin into the host (a log line, the
        // output, a booking): more traps the run. Log lines and the output are then read
        // only as far as the history keeps them (see `run` below and the `log` import).
        store.set_hostcall_fuel(HOSTCALL_FUEL);
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);
        // The output and the error message go into the Plan's history (and so Redis),
        // at most MAX_OUTPUT_BYTES of each. They are copied out whole (at most wasmtime's
        // 16 MiB a value): wasmtime calls the guest's post-return, which frees them,
        // before `call_async` returns, so a `WasmStr` read afterwards reads freed guest
        // memory (componentize-py components reuse it at once: invalid UTF-8).
        let call = async {
            let instance = pre.instance_pre().instantiate_async(&mut store).await?;
            match export {
                Export::Run(wit_ctx, input) => {
                    let run = instance
                        .get_typed_func::<(wit::Context, &str), (Result<String, RunError>,)>(
                            &mut store, "run",
                        )?;
                    let (answer,): (Result<String, RunError>,) =
                        run.call_async(&mut store, (wit_ctx, input)).await?;
                    Ok::<_, wasmtime::Error>(Answer::Run(match answer {
                        Ok(output) => Ok(prefix(&output, MAX_OUTPUT_BYTES).to_string()),
                        Err(e) => Err((
                            prefix(&e.message, MAX_OUTPUT_BYTES).to_string(),
                            e.retryable,
                        )),
                    }))
                }
                Export::InputSchema => {
                    // A component built for WIT 0.1 has no such export.
                    if instance
                        .get_export_index(&mut store, None, "input-schema")
                        .is_none()
                    {
                        return Ok(Answer::InputSchema(None));
                    }
                    let schema = instance
                        .get_typed_func::<(), (Option<String>,)>(&mut store, "input-schema")?;
                    let (text,) = schema.call_async(&mut store, ()).await?;
                    Ok(Answer::InputSchema(text))
                }
            }
        };
        let result = match tokio::time::timeout(Duration::from_millis(meta.timeout_ms), call).await
        {
            Err(_) => Err(Failure::Timeout(meta.timeout_ms)),
            Ok(Err(trap)) => Err(Failure::Trap(root(&trap))),
            Ok(Ok(answer)) => Ok(answer),
        };
        drop(store);
        (result, logs.take(), fenced.load(Ordering::Acquire))
    }

    /// Loads a plugin for the benchmark, which then calls `invoke_loaded` directly.
    pub async fn preload(&self, spec: &str) -> Result<(ActionPre<Sandbox>, PluginMeta), String> {
        let meta = self
            .registry()
            .resolve(spec)
            .await
            .map_err(|e| e.message)?
            .ok_or_else(|| format!("no plugin `{spec}`"))?;
        let pre = self.load(&meta.digest).await.map_err(|f| f.message(spec))?;
        Ok((pre, meta))
    }
}

/// Which export [`PluginRuntime::call_export`] calls.
enum Export<'a> {
    Run(wit::Context, &'a str),
    InputSchema,
}

/// What an export answered: `run`'s output or error (message, retryable), or the
/// input schema.
enum Answer {
    Run(Result<String, (String, bool)>),
    InputSchema(Option<String>),
}

/// The longest an upload waits for the component's `input-schema` (or the upload's own
/// timeout, when shorter): it returns a constant, and an upload request must not hang.
const INPUT_SCHEMA_TIMEOUT_MS: u64 = 5_000;

/// The largest input schema an upload may declare.
const MAX_INPUT_SCHEMA_BYTES: usize = 64 * 1024;

/// A component compiled and linked by [`PluginRuntime::check`].
pub struct Compiled {
    /// The JSON Schema text the component declares for its input, checked.
    pub input_schema: Option<String>,
    /// Where its compiled code came from.
    pub how: Prepared,
}

/// Where an upload's compiled code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// This host held the same bytes prepared already (another name, or a warm-up).
    Resident,
    /// This host's disk cache had them compiled (from before a restart, or another
    /// process sharing the data directory).
    FromDiskCache,
    /// Compiled now.
    Compiled,
}

impl Prepared {
    pub fn as_str(self) -> &'static str {
        match self {
            Prepared::Resident => "resident",
            Prepared::FromDiskCache => "disk_cache",
            Prepared::Compiled => "compiled",
        }
    }
}

/// Writes a component's compiled artifact to the disk cache at `path`, followed by its
/// checksum (see `checked_artifact`); written then renamed, so that another host process
/// never reads half. Best effort: a cache that cannot be written only costs a compile.
fn write_artifact(path: &std::path::Path, component: &Component) {
    if let Ok(mut serialized) = component.serialize() {
        let sum = Sha256::digest(&serialized);
        serialized.extend_from_slice(&sum);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, serialized).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
        if let Some(dir) = path.parent() {
            prune_cache(dir);
        }
    }
}

/// The compiled artifact in a cache file, which is the artifact followed by its SHA-256;
/// None when the file is damaged (or from before the checksum), so that it is compiled
/// again rather than run.
fn checked_artifact(file: &[u8]) -> Option<&[u8]> {
    let split = file.len().checked_sub(32)?;
    let (artifact, sum) = file.split_at(split);
    (Sha256::digest(artifact).as_slice() == sum).then_some(artifact)
}

/// A `plugin-error` as `run` returns it.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct RunError {
    message: String,
    retryable: bool,
}

fn level_name(level: super::bindings::kairos::plugin0_1_0::log::Level) -> &'static str {
    use super::bindings::kairos::plugin0_1_0::log::Level;
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

/// The first `max` bytes of `text`, cut at a character boundary, borrowed.
pub(crate) fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The innermost cause of a wasmtime error, which names the trap.
fn root(e: &wasmtime::Error) -> String {
    let mut text = e.root_cause().to_string();
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        text = format!("{trap}");
    }
    text.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::{
        checked_artifact, prefix, prune_cache, Failure, Resident, MAX_CACHED_ARTIFACTS,
        MAX_RESIDENT_COMPONENTS,
    };
    use sha2::{Digest, Sha256};
    use std::sync::Arc;

    #[test]
    fn a_cache_file_is_used_only_when_its_checksum_matches() {
        let artifact = b"compiled code".to_vec();
        let mut file = artifact.clone();
        file.extend_from_slice(&Sha256::digest(&artifact));
        assert_eq!(checked_artifact(&file), Some(&artifact[..]));
        let mut flipped = file.clone();
        flipped[3] ^= 1;
        assert_eq!(checked_artifact(&flipped), None);
        assert_eq!(checked_artifact(&file[..file.len() - 1]), None);
        assert_eq!(checked_artifact(&file[..10]), None);
        assert_eq!(checked_artifact(&artifact), None);
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        assert_eq!(prefix("abc", 4), "abc");
        assert_eq!(prefix("abcdef", 4), "abcd");
        // "é" is two bytes: cutting after 3 bytes would split it.
        assert_eq!(prefix("abé", 3), "ab");
    }

    #[test]
    fn resident_components_are_bounded_least_recently_used_first() {
        let mut resident = Resident::default();
        let first = resident.get("d0");
        for i in 1..MAX_RESIDENT_COMPONENTS {
            resident.get(&format!("d{i}"));
        }
        // d0 used again: d1 is now the least recently used.
        assert!(Arc::ptr_eq(&first, &resident.get("d0")));
        resident.get("new");
        assert_eq!(resident.len(), MAX_RESIDENT_COMPONENTS);
        assert!(resident.by_digest.contains_key("d0"));
        assert!(!resident.by_digest.contains_key("d1"));
    }

    #[test]
    fn the_disk_cache_keeps_the_newest_artifacts() {
        let dir = std::env::temp_dir().join(format!("kairos-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let now = std::time::SystemTime::now();
        for i in 0..MAX_CACHED_ARTIFACTS + 10 {
            let path = dir.join(format!("{i:04}.cwasm"));
            std::fs::write(&path, b"x").unwrap();
            let f = std::fs::File::options().append(true).open(&path).unwrap();
            f.set_modified(now - std::time::Duration::from_secs((1000 - i) as u64))
                .unwrap();
        }
        prune_cache(&dir);
        let left = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(left, MAX_CACHED_ARTIFACTS);
        assert!(!dir.join("0000.cwasm").exists(), "the oldest goes");
        assert!(dir
            .join(format!("{:04}.cwasm", MAX_CACHED_ARTIFACTS + 9))
            .exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_a_plugin_asking_for_it_or_an_unreachable_redis_is_retried() {
        let plugin = |retryable| Failure::Plugin {
            message: "m".into(),
            retryable,
        };
        assert!(plugin(true).retryable());
        assert!(!plugin(false).retryable());
        assert!(Failure::Unavailable("redis".into()).retryable());
        assert!(!Failure::Setup("no plugin".into()).retryable());
        assert!(!Failure::Trap("unreachable".into()).retryable());
        assert!(!Failure::Timeout(100).retryable());
        assert_eq!(
            Failure::Timeout(100).message("loop"),
            "plugin loop ran past its 100 ms deadline and was stopped"
        );
    }
}
