//! Startup configuration: every parameter of SPEC section 4 (plus the operational ones)
//! from a flag, a `KAIROS_*` environment variable or a TOML file, in that order of
//! precedence, then the default.
//!
//! Flags and env vars are read by clap ([`ServeArgs`]); the file is a flat TOML table whose
//! keys are the parameter names (`booking_plan_watch_interval = "10s"`). Durations take a
//! plain number in the parameter's unit or a humantime string (`500ms`, `30s`, `3m`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono_tz::Tz;
use clap::Args;
use thiserror::Error;

/// A configuration value that could not be used; the message names the parameter.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// What a bearer token may do. Scopes nest: `admin` may do everything `book` may, and
/// `book` everything `read` may, so one token per service is enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Look at bookings, timers, queues, plugins.
    Read,
    /// Create, change and cancel bookings.
    Book,
    /// Manage plugins, queues and the host itself.
    Admin,
}

impl Scope {
    fn parse(s: &str) -> Result<Self, ConfigError> {
        match s {
            "read" => Ok(Scope::Read),
            "book" => Ok(Scope::Book),
            "admin" => Ok(Scope::Admin),
            other => Err(ConfigError(format!(
                "unknown API token scope `{other}` (expected read, book or admin)"
            ))),
        }
    }
}

/// Flags of `kairos serve`. Every value is optional here: [`Config::resolve`] merges them
/// with the config file and the defaults.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the parameters below as top-level keys.
    #[arg(long, env = "KAIROS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Redis to use, e.g. redis://127.0.0.1:6379/0. When absent, kairos starts and
    /// supervises its own redis-server (append-only file on) under --data-dir.
    #[arg(long, env = "KAIROS_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Address of the REST API [default: 127.0.0.1:8080].
    #[arg(long, env = "KAIROS_LISTEN")]
    pub listen: Option<String>,
    /// Allow listening on a non-loopback address without API tokens.
    #[arg(long, env = "KAIROS_INSECURE")]
    pub insecure: bool,
    /// Base URL that webhook `path`s are joined to, e.g. http://gateway:8000.
    #[arg(long, env = "KAIROS_GATEWAY_URL")]
    pub gateway_url: Option<String>,
    /// Prefix of every Redis key [default: kairos]. Needs no hash tag on a Redis Cluster:
    /// each shard's keys carry their own (`kairos:{s4.10}:...`), and a prefix with braces
    /// would put every shard in one slot, so braces are refused.
    #[arg(long, env = "KAIROS_KEY_PREFIX")]
    pub key_prefix: Option<String>,
    /// IANA zone of booking times written without an offset [default: UTC].
    #[arg(long, env = "KAIROS_TIMEZONE")]
    pub timezone: Option<String>,
    /// Longest gap between two scans of Redis for due Plans (ms) [default: 10s].
    #[arg(long, env = "KAIROS_BOOKING_PLAN_WATCH_INTERVAL")]
    pub booking_plan_watch_interval: Option<String>,
    /// Look-ahead: Plans due within it are claimed into memory (ms) [default: 5m].
    #[arg(long, env = "KAIROS_PRESET_EXECUTION_TIME")]
    pub preset_execution_time: Option<String>,
    /// Shortest term of a term Life (ms) [default: 3m].
    #[arg(long, env = "KAIROS_MINIMUM_LIFE_TERM")]
    pub minimum_life_term: Option<String>,
    /// A time closer than this to now is refused with 406 (ms) [default: 30s].
    #[arg(long, env = "KAIROS_EXECUTION_GUARD_TIME")]
    pub execution_guard_time: Option<String>,
    /// Margin around a resource's bookings for the 409 conflict check (ms) [default: 60m].
    #[arg(long, env = "KAIROS_EXECUTION_DELAY_GUARD_TIME")]
    pub execution_delay_guard_time: Option<String>,
    /// A birth later than this is Invalidated instead of run (ms) [default: 3m].
    #[arg(long, env = "KAIROS_BIRTH_DELAY_LIMIT_TIME")]
    pub birth_delay_limit_time: Option<String>,
    /// Retry period of a failing death action (ms) [default: 1m].
    #[arg(long, env = "KAIROS_DEATH_RETRY_INTERVAL")]
    pub death_retry_interval: Option<String>,
    /// How long the answer to a booking call made with an `Idempotency-Key` is replayed
    /// to repeats of that call (s) [default: 24h].
    #[arg(long, env = "KAIROS_IDEMPOTENCY_TTL")]
    pub idempotency_ttl: Option<String>,
    /// Retention of history and finished Lives, in days (fractions allowed) [default: 1].
    #[arg(long, env = "KAIROS_SCHEDULE_HISTORY_DURATION_DAYS")]
    pub schedule_history_duration_days: Option<String>,
    /// Bound of the queue of fired Plans waiting for a worker [default: 256].
    #[arg(long, env = "KAIROS_TIMEDOUT_QUEUE_MAX_SIZE")]
    pub timedout_queue_max_size: Option<String>,
    /// Response codes that are retried; 599 is a connect error or timeout. A target's
    /// `Retry-After` on such an answer sets the next attempt's time
    /// [default: 429,500,502,503,504,599].
    #[arg(long, env = "KAIROS_EXECUTION_RETRY_CODES")]
    pub execution_retry_codes: Option<String>,
    /// Most actions this host runs at once (each slot covers one outbound call)
    /// [default: 256].
    #[arg(long, env = "KAIROS_WORKERS")]
    pub workers: Option<String>,
    /// Threads that run plugin code, apart from the threads that claim, start, finish
    /// and call webhooks, and at a lower CPU priority: a busy plugin then cannot make
    /// other bookings late [default: one fewer than the machine's cores, at least 1].
    #[arg(long, env = "KAIROS_PLUGIN_THREADS")]
    pub plugin_threads: Option<String>,
    /// Most Plans this host holds claimed in memory at once [default: 100000].
    #[arg(long, env = "KAIROS_MAX_CLAIMED")]
    pub max_claimed: Option<String>,
    /// How long a host's claim on its Plans lasts without a heartbeat (ms) [default: 4s].
    /// A crashed host's Plans are taken over about this long after it stopped; the
    /// heartbeat renews it every quarter of it.
    #[arg(long, env = "KAIROS_LEASE_TTL")]
    pub lease_ttl: Option<String>,
    /// How long a SIGTERM waits for the runs under way before handing the rest back (ms)
    /// [default: 30s].
    #[arg(long, env = "KAIROS_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<String>,
    /// API bearer tokens, comma separated, each `TOKEN:scope` with scope read, book or
    /// admin. Without tokens the API is open (loopback only unless --insecure).
    #[arg(long, env = "KAIROS_API_TOKENS")]
    pub api_tokens: Option<String>,
    /// Largest accepted request body in bytes [default: 1048576].
    #[arg(long, env = "KAIROS_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<String>,
    /// Memory cap of a plugin uploaded without `memory_mb`, in MiB [default: 64].
    #[arg(long, env = "KAIROS_PLUGIN_MEMORY_MB")]
    pub plugin_memory_mb: Option<String>,
    /// Wall-time limit of a plugin run when the upload gives no `timeout` (s) [default: 10s].
    #[arg(long, env = "KAIROS_PLUGIN_TIMEOUT")]
    pub plugin_timeout: Option<String>,
    /// Largest accepted plugin component in bytes [default: 33554432].
    #[arg(long, env = "KAIROS_MAX_PLUGIN_BYTES")]
    pub max_plugin_bytes: Option<String>,
    /// Where a self-managed redis-server keeps its data, and the compiled-plugin cache
    /// [default: ./.kairos-data].
    #[arg(long, env = "KAIROS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Name of this host in leases and history [default: hostname-pid-random].
    #[arg(long, env = "KAIROS_HOST_ID")]
    pub host_id: Option<String>,
    /// HMAC-SHA256 key for the X-Kairos-Signature header of webhooks.
    #[arg(long, env = "KAIROS_SIGNING_KEY")]
    pub signing_key: Option<String>,
    /// Outbound allowlist for absolute webhook `url`s, comma separated `host` or
    /// `host:port`; `*` allows any public address. Loopback, link-local and private
    /// addresses are refused unless listed by name. The gateway is always allowed.
    #[arg(long, env = "KAIROS_ALLOWED_HOSTS")]
    pub allowed_hosts: Option<String>,
    /// Most bytes of a webhook response body that are read [default: 65536].
    #[arg(long, env = "KAIROS_RESPONSE_BODY_LIMIT")]
    pub response_body_limit: Option<String>,
    /// Default connect timeout of webhook actions (s) [default: 10s].
    #[arg(long, env = "KAIROS_CONNECT_TIMEOUT")]
    pub connect_timeout: Option<String>,
    /// Default request timeout of webhook actions (s) [default: 30s].
    #[arg(long, env = "KAIROS_REQUEST_TIMEOUT")]
    pub request_timeout: Option<String>,
    /// PEM file of extra CA certificates trusted for https:// webhook targets, on top of
    /// the Mozilla roots compiled in (for targets behind a private CA).
    #[arg(long, env = "KAIROS_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Keep a `runs` stream per shard, capped near this length, with every run for
    /// operators to tail; 0 keeps none (each run's history stays with its Life, timer or
    /// task either way) [default: 0].
    #[arg(long, env = "KAIROS_RUNS_STREAM_MAX_LEN")]
    pub runs_stream_max_len: Option<String>,
    /// Logical shards of a new keyspace (1-1024), fixed once it is created; leave it out
    /// to use an existing keyspace's [default: 32]. See docs/operations.md.
    #[arg(long, env = "KAIROS_SHARDS")]
    pub shards: Option<String>,
    /// Answer a booking only once this many replicas hold it (Redis WAIT), so that a
    /// failover loses no acknowledged booking [default: 0].
    #[arg(long, env = "KAIROS_MIN_REPLICAS_ACK")]
    pub min_replicas_ack: Option<String>,
    /// Keep at most this many finished Lives (with their runs) as history, besides the
    /// retention by age; the oldest go first. Split evenly over the shards [default: no
    /// limit].
    #[arg(long, env = "KAIROS_HISTORY_MAX_LIVES")]
    pub history_max_lives: Option<String>,
    /// Keep the history (finished Lives with their Plans and runs) within about this
    /// many bytes of Redis memory, such as 512mb or 2gb, besides the retention by age and
    /// count; the oldest go first. Estimated from MEMORY USAGE of a sample, every 10 s,
    /// and split evenly over the shards [default: no limit].
    #[arg(long, env = "KAIROS_HISTORY_MAX_BYTES")]
    pub history_max_bytes: Option<String>,
    /// Also serve /metrics, without a token, on this address (e.g. 0.0.0.0:9090 for
    /// Prometheus); /metrics stays on --listen too, under the read scope.
    #[arg(long, env = "KAIROS_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Run on a Redis whose maxmemory-policy may evict keys (anything but noeviction).
    /// Evicted keys are lost bookings and lost resource locks: leave this off.
    #[arg(long, env = "KAIROS_ALLOW_EVICTION")]
    pub allow_eviction: bool,
    /// maxmemory of the redis-server kairos starts itself (no --redis-url), in bytes or
    /// with a unit such as 512mb or 4gb [default: half of this machine's memory].
    #[arg(long, env = "KAIROS_REDIS_MAXMEMORY")]
    pub redis_maxmemory: Option<String>,
    /// How the redis-server kairos starts itself syncs its append-only file: `everysec`
    /// (a power loss may drop the last second of acknowledged bookings) or `always`
    /// (fsync before each answer; slower bookings) [default: everysec].
    #[arg(long, env = "KAIROS_DURABILITY")]
    pub durability: Option<String>,
    /// `system`, or `manual` for users' integration tests: the clock runs and may also be
    /// moved ahead with `POST /clock`, every Plan due on the way firing in order (loopback
    /// only) [default: system].
    #[arg(long, env = "KAIROS_CLOCK")]
    pub clock: Option<String>,
}

/// An API token and the scope it grants.
#[derive(Debug, Clone)]
pub struct ApiToken {
    /// What the audit log calls it: the name given (`name@token:scope`), or else a
    /// fingerprint of the token (not the secret itself).
    pub name: String,
    /// The secret a client sends as `Authorization: Bearer {token}`.
    pub token: String,
    /// The highest scope it grants.
    pub scope: Scope,
}

/// One entry of the outbound allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHost {
    /// `*`: any host whose addresses are all public.
    AnyPublic,
    /// A host name or address, on any port or on one port.
    Host {
        /// Lower-case host name or IP literal.
        host: String,
        /// Port, when the entry named one.
        port: Option<u16>,
    },
}

/// The resolved configuration a host runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub redis_url: Option<String>,
    pub listen: SocketAddr,
    pub insecure: bool,
    pub gateway_url: Option<String>,
    pub key_prefix: String,
    pub timezone: Tz,
    pub booking_plan_watch_interval: Duration,
    pub preset_execution_time: Duration,
    pub minimum_life_term: Duration,
    pub execution_guard_time: Duration,
    pub execution_delay_guard_time: Duration,
    pub birth_delay_limit_time: Duration,
    pub death_retry_interval: Duration,
    /// How long an `Idempotency-Key`'s answer is replayed.
    pub idempotency_ttl: Duration,
    /// Retention of history and finished Lives.
    pub history_retention: Duration,
    pub timedout_queue_max_size: usize,
    pub execution_retry_codes: Vec<u16>,
    pub workers: usize,
    /// Threads of the plugin pool (`plugins::runtime`).
    pub plugin_threads: usize,
    pub max_claimed: usize,
    pub lease_ttl: Duration,
    pub shutdown_timeout: Duration,
    pub api_tokens: Vec<ApiToken>,
    pub max_body_bytes: usize,
    pub plugin_memory_mb: u32,
    pub plugin_timeout: Duration,
    pub max_plugin_bytes: usize,
    pub data_dir: PathBuf,
    pub host_id: String,
    pub signing_key: Option<String>,
    pub allowed_hosts: Vec<AllowedHost>,
    pub response_body_limit: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub runs_stream_max_len: usize,
    pub tls_ca_file: Option<PathBuf>,
    /// Shards asked for (None: the keyspace's, or 32 for a new one).
    pub shards: Option<u32>,
    pub min_replicas_ack: u32,
    /// Most finished Lives kept as history (None: only the retention by age).
    pub history_max_lives: Option<u64>,
    /// Most bytes of Redis the history may take (None: no bound by size).
    pub history_max_bytes: Option<u64>,
    /// Where /metrics is also served, without a token.
    pub metrics_listen: Option<SocketAddr>,
    /// Start even when Redis may evict keys.
    pub allow_eviction: bool,
    /// maxmemory of the managed redis-server, as Redis reads it (`512mb`, bytes).
    pub redis_maxmemory: Option<String>,
    /// appendfsync of the managed redis-server: `everysec` or `always`.
    pub durability: String,
    /// `--clock manual`: `POST /clock` may move the engine's clock ahead.
    pub manual_clock: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config::resolve(&ServeArgs::default()).expect("defaults are valid")
    }
}

/// Values from the config file, keyed by parameter name, as strings.
type FileValues = BTreeMap<String, String>;

fn read_file(path: &PathBuf) -> Result<FileValues, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| ConfigError(format!("config file {} is not TOML: {e}", path.display())))?;
    let mut values = FileValues::new();
    for (key, value) in table {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            return Err(ConfigError(format!(
                "config file {}: unknown key `{key}`",
                path.display()
            )));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
            other => {
                return Err(ConfigError(format!(
                    "config file {}: `{key}` has an unsupported value {other}",
                    path.display()
                )))
            }
        };
        values.insert(key, text);
    }
    Ok(values)
}

const KNOWN_KEYS: &[&str] = &[
    "redis_url",
    "listen",
    "insecure",
    "gateway_url",
    "key_prefix",
    "timezone",
    "booking_plan_watch_interval",
    "preset_execution_time",
    "minimum_life_term",
    "execution_guard_time",
    "execution_delay_guard_time",
    "birth_delay_limit_time",
    "death_retry_interval",
    "idempotency_ttl",
    "schedule_history_duration_days",
    "timedout_queue_max_size",
    "execution_retry_codes",
    "workers",
    "plugin_threads",
    "max_claimed",
    "lease_ttl",
    "shutdown_timeout",
    "api_tokens",
    "max_body_bytes",
    "plugin_memory_mb",
    "plugin_timeout",
    "max_plugin_bytes",
    "data_dir",
    "host_id",
    "signing_key",
    "allowed_hosts",
    "response_body_limit",
    "connect_timeout",
    "request_timeout",
    "runs_stream_max_len",
    "tls_ca_file",
    "shards",
    "min_replicas_ack",
    "history_max_lives",
    "history_max_bytes",
    "metrics_listen",
    "allow_eviction",
    "redis_maxmemory",
    "durability",
    "clock",
];

/// The plugin pool's threads unless configured: one fewer than the machine's cores (at
/// least one), so that plugins that spin never hold every core.
pub fn default_plugin_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1))
        .unwrap_or(1)
        .max(1)
}

/// Checks a memory size as redis-server reads it: bytes, or a number with `kb`, `mb`,
/// `gb` (or `k`, `m`, `g`); returns it lower-cased.
fn parse_memory_size(text: &str) -> Result<String, ConfigError> {
    let size = text.trim().to_ascii_lowercase();
    let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &size[digits.len()..];
    let ok = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.parse::<u64>().is_ok_and(|n| n > 0)
        && ["", "b", "k", "kb", "m", "mb", "g", "gb"].contains(&unit);
    if !ok {
        return Err(ConfigError(format!(
            "redis_maxmemory: `{text}` is not a size such as 512mb or 4gb"
        )));
    }
    Ok(size)
}

/// A size as redis-server reads one, in bytes: a number alone, or with `k`/`m`/`g`
/// (powers of 1000) or `kb`/`mb`/`gb` (powers of 1024), in any case. None when it is not
/// such a size, or is 0.
pub fn memory_size_bytes(text: &str) -> Option<u64> {
    let size = text.trim().to_ascii_lowercase();
    let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &size[digits.len()..] {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| *n > 0)
}

/// Parses a duration: a plain number (fractions allowed) in `unit`, or a humantime string
/// such as `500ms`, `30s`, `3m`, `1h 30m`.
pub fn parse_duration(text: &str, unit: Duration) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(number) = text.parse::<f64>() {
        if !number.is_finite() || number < 0.0 {
            return Err(format!("`{text}` is not a duration of zero or more"));
        }
        return Duration::try_from_secs_f64(unit.as_secs_f64() * number)
            .map_err(|_| format!("`{text}` is too long a duration"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration (a number or e.g. 500ms, 30s, 3m): {e}"))
}

struct Resolver<'a> {
    file: FileValues,
    _args: &'a ServeArgs,
}

impl Resolver<'_> {
    /// The flag/env value if given, else the file's, else None.
    fn pick(&self, name: &str, cli: &Option<String>) -> Option<String> {
        cli.clone().or_else(|| self.file.get(name).cloned())
    }

    fn duration(
        &self,
        name: &str,
        cli: &Option<String>,
        unit: Duration,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match self.pick(name, cli) {
            None => Ok(default),
            Some(text) => {
                parse_duration(&text, unit).map_err(|e| ConfigError(format!("{name}: {e}")))
            }
        }
    }

    fn number<T: std::str::FromStr>(
        &self,
        name: &str,
        cli: &Option<String>,
        default: T,
    ) -> Result<T, ConfigError> {
        match self.pick(name, cli) {
            None => Ok(default),
            Some(text) => text
                .trim()
                .parse()
                .map_err(|_| ConfigError(format!("{name}: `{text}` is not a valid number"))),
        }
    }
}

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

impl Config {
    /// Merges flags and env vars (already in `args`), the config file they name, and the
    /// defaults of SPEC section 4.
    pub fn resolve(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileValues::new(),
        };
        let r = Resolver { file, _args: args };
        let listen_text = r
            .pick("listen", &args.listen)
            .unwrap_or_else(|| "127.0.0.1:8080".into());
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            ConfigError(format!(
                "listen: `{listen_text}` is not an address like 127.0.0.1:8080"
            ))
        })?;
        let timezone_text = r
            .pick("timezone", &args.timezone)
            .unwrap_or_else(|| "UTC".into());
        let timezone: Tz = timezone_text.parse().map_err(|_| {
            ConfigError(format!(
                "timezone: `{timezone_text}` is not an IANA zone such as Asia/Tokyo"
            ))
        })?;
        let retention_days: f64 = r.number(
            "schedule_history_duration_days",
            &args.schedule_history_duration_days,
            1.0,
        )?;
        if !retention_days.is_finite() || retention_days <= 0.0 {
            return Err(ConfigError(
                "schedule_history_duration_days: must be more than 0".into(),
            ));
        }
        let codes_text = r
            .pick("execution_retry_codes", &args.execution_retry_codes)
            .unwrap_or_else(|| "429,500,502,503,504,599".into());
        let execution_retry_codes = codes_text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.parse::<u16>() {
                Ok(code) if (100..=599).contains(&code) => Ok(code),
                _ => Err(ConfigError(format!(
                    "execution_retry_codes: `{s}` is not an HTTP status code"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let api_tokens = match r.pick("api_tokens", &args.api_tokens) {
            None => Vec::new(),
            Some(text) => parse_tokens(&text)?,
        };
        let allowed_hosts = match r.pick("allowed_hosts", &args.allowed_hosts) {
            None => Vec::new(),
            Some(text) => parse_allowed_hosts(&text)?,
        };
        let gateway_url = r
            .pick("gateway_url", &args.gateway_url)
            .map(|s| s.trim_end_matches('/').to_string());
        if let Some(url) = &gateway_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError(format!(
                    "gateway_url: `{url}` must start with http:// or https://"
                )));
            }
        }
        let insecure =
            args.insecure || r.file.get("insecure").map(|v| v == "true").unwrap_or(false);
        let config = Config {
            redis_url: r.pick("redis_url", &args.redis_url),
            listen,
            insecure,
            gateway_url,
            key_prefix: r
                .pick("key_prefix", &args.key_prefix)
                .unwrap_or_else(|| "kairos".into()),
            timezone,
            booking_plan_watch_interval: r.duration(
                "booking_plan_watch_interval",
                &args.booking_plan_watch_interval,
                MS,
                Duration::from_secs(10),
            )?,
            preset_execution_time: r.duration(
                "preset_execution_time",
                &args.preset_execution_time,
                MS,
                Duration::from_secs(300),
            )?,
            minimum_life_term: r.duration(
                "minimum_life_term",
                &args.minimum_life_term,
                MS,
                Duration::from_secs(180),
            )?,
            execution_guard_time: r.duration(
                "execution_guard_time",
                &args.execution_guard_time,
                MS,
                Duration::from_secs(30),
            )?,
            execution_delay_guard_time: r.duration(
                "execution_delay_guard_time",
                &args.execution_delay_guard_time,
                MS,
                Duration::from_secs(3600),
            )?,
            birth_delay_limit_time: r.duration(
                "birth_delay_limit_time",
                &args.birth_delay_limit_time,
                MS,
                Duration::from_secs(180),
            )?,
            death_retry_interval: r.duration(
                "death_retry_interval",
                &args.death_retry_interval,
                MS,
                Duration::from_secs(60),
            )?,
            idempotency_ttl: match r.duration(
                "idempotency_ttl",
                &args.idempotency_ttl,
                SECOND,
                Duration::from_secs(86_400),
            )? {
                ttl if ttl >= Duration::from_secs(1) => ttl,
                _ => return Err(ConfigError("idempotency_ttl: must be 1 s or more".into())),
            },
            history_retention: Duration::from_secs_f64(retention_days * 86_400.0),
            timedout_queue_max_size: r.number(
                "timedout_queue_max_size",
                &args.timedout_queue_max_size,
                256usize,
            )?,
            execution_retry_codes,
            workers: r.number("workers", &args.workers, 256usize)?,
            plugin_threads: r.number(
                "plugin_threads",
                &args.plugin_threads,
                default_plugin_threads(),
            )?,
            max_claimed: r.number("max_claimed", &args.max_claimed, 100_000usize)?,
            lease_ttl: r.duration("lease_ttl", &args.lease_ttl, MS, Duration::from_secs(4))?,
            shutdown_timeout: r.duration(
                "shutdown_timeout",
                &args.shutdown_timeout,
                MS,
                Duration::from_secs(30),
            )?,
            api_tokens,
            max_body_bytes: r.number("max_body_bytes", &args.max_body_bytes, 1usize << 20)?,
            plugin_memory_mb: r.number("plugin_memory_mb", &args.plugin_memory_mb, 64u32)?,
            plugin_timeout: r.duration(
                "plugin_timeout",
                &args.plugin_timeout,
                SECOND,
                Duration::from_secs(10),
            )?,
            max_plugin_bytes: r.number(
                "max_plugin_bytes",
                &args.max_plugin_bytes,
                32usize << 20,
            )?,
            data_dir: args
                .data_dir
                .clone()
                .or_else(|| r.file.get("data_dir").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(".kairos-data")),
            host_id: r
                .pick("host_id", &args.host_id)
                .unwrap_or_else(default_host_id),
            signing_key: r.pick("signing_key", &args.signing_key),
            allowed_hosts,
            response_body_limit: r.number(
                "response_body_limit",
                &args.response_body_limit,
                64usize * 1024,
            )?,
            connect_timeout: r.duration(
                "connect_timeout",
                &args.connect_timeout,
                SECOND,
                Duration::from_secs(10),
            )?,
            request_timeout: r.duration(
                "request_timeout",
                &args.request_timeout,
                SECOND,
                Duration::from_secs(30),
            )?,
            runs_stream_max_len: r.number(
                "runs_stream_max_len",
                &args.runs_stream_max_len,
                0usize,
            )?,
            tls_ca_file: args
                .tls_ca_file
                .clone()
                .or_else(|| r.file.get("tls_ca_file").map(PathBuf::from)),
            shards: match r.pick("shards", &args.shards) {
                Some(text) => Some(
                    text.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1024).contains(n))
                        .ok_or_else(|| {
                            ConfigError(format!(
                                "shards: `{text}` is not a whole number from 1 to 1024"
                            ))
                        })?,
                ),
                None => None,
            },
            min_replicas_ack: r.number("min_replicas_ack", &args.min_replicas_ack, 0u32)?,
            history_max_lives: match r.pick("history_max_lives", &args.history_max_lives) {
                Some(text) => Some(
                    text.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| {
                            ConfigError(format!(
                                "history_max_lives: `{text}` is not a whole number of 1 or more"
                            ))
                        })?,
                ),
                None => None,
            },
            history_max_bytes: match r.pick("history_max_bytes", &args.history_max_bytes) {
                Some(text) => Some(memory_size_bytes(&text).ok_or_else(|| {
                    ConfigError(format!(
                        "history_max_bytes: `{text}` is not a size such as 512mb or 2gb"
                    ))
                })?),
                None => None,
            },
            metrics_listen: match r.pick("metrics_listen", &args.metrics_listen) {
                Some(text) => Some(text.parse().map_err(|_| {
                    ConfigError(format!(
                        "metrics_listen: `{text}` is not an address like 127.0.0.1:9090"
                    ))
                })?),
                None => None,
            },
            allow_eviction: args.allow_eviction
                || r.file
                    .get("allow_eviction")
                    .map(|v| v == "true")
                    .unwrap_or(false),
            redis_maxmemory: match r.pick("redis_maxmemory", &args.redis_maxmemory) {
                Some(text) => Some(parse_memory_size(&text)?),
                None => None,
            },
            durability: match r.pick("durability", &args.durability) {
                None => "everysec".into(),
                Some(text) if text == "everysec" || text == "always" => text,
                Some(text) => {
                    return Err(ConfigError(format!(
                        "durability: `{text}` is neither `everysec` nor `always`"
                    )))
                }
            },
            manual_clock: match r.pick("clock", &args.clock).as_deref() {
                None | Some("system") => false,
                Some("manual") => true,
                Some(text) => {
                    return Err(ConfigError(format!(
                        "clock: `{text}` is neither `system` nor `manual`"
                    )))
                }
            },
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError("workers: must be at least 1".into()));
        }
        if !(1..=1024).contains(&self.plugin_threads) {
            return Err(ConfigError(
                "plugin_threads: must be between 1 and 1024".into(),
            ));
        }
        if self.timedout_queue_max_size == 0 {
            return Err(ConfigError(
                "timedout_queue_max_size: must be at least 1".into(),
            ));
        }
        if self.max_claimed == 0 {
            return Err(ConfigError("max_claimed: must be at least 1".into()));
        }
        if self.lease_ttl < Duration::from_millis(300) {
            return Err(ConfigError("lease_ttl: must be at least 300ms".into()));
        }
        if self.booking_plan_watch_interval.is_zero() {
            return Err(ConfigError(
                "booking_plan_watch_interval: must be more than 0".into(),
            ));
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(ConfigError(
                "key_prefix: must not contain `{` or `}`: each shard's keys carry a hash tag of their own, and one in the prefix would put every shard in one Redis Cluster slot".into(),
            ));
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(char::is_whitespace) {
            return Err(ConfigError(
                "key_prefix: must be non-empty without spaces".into(),
            ));
        }
        if self.manual_clock && !self.listen.ip().is_loopback() {
            return Err(ConfigError(format!(
                "clock: `manual` is for tests (any API caller with the admin scope could move time); listen on a loopback address, not {}",
                self.listen
            )));
        }
        Ok(())
    }

    /// True when the API must refuse to start: no tokens, a non-loopback address, and no
    /// `--insecure`.
    pub fn refuses_open_listen(&self) -> bool {
        self.api_tokens.is_empty() && !self.listen.ip().is_loopback() && !self.insecure
    }
}

/// A token's name when none is given: `token-` and the first 8 hex digits of its
/// SHA-256, enough to tell tokens apart in a log without writing the secret there.
fn token_fingerprint(token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(token.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("token-{hex}")
}

fn parse_tokens(text: &str) -> Result<Vec<ApiToken>, ConfigError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (named, scope) = entry.rsplit_once(':').ok_or_else(|| {
                ConfigError(
                    "api_tokens: each entry is [name@]TOKEN:scope (read, book or admin)".into(),
                )
            })?;
            let (name, token) = match named.split_once('@') {
                Some((name, token)) if !name.is_empty() => (name.to_string(), token),
                _ => (token_fingerprint(named), named),
            };
            if token.is_empty() {
                return Err(ConfigError("api_tokens: empty token".into()));
            }
            Ok(ApiToken {
                name,
                token: token.to_string(),
                scope: Scope::parse(scope)?,
            })
        })
        .collect()
}

pub fn parse_allowed_hosts(text: &str) -> Result<Vec<AllowedHost>, ConfigError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            if entry == "*" {
                return Ok(AllowedHost::AnyPublic);
            }
            if entry.contains("://") || entry.contains('/') {
                return Err(ConfigError(format!(
                    "allowed_hosts: `{entry}` has a scheme or a path; give host or host:port only (e.g. 127.0.0.1:18399)"
                )));
            }
            let (host, port) = split_host_port(entry).ok_or_else(|| {
                ConfigError(format!("allowed_hosts: `{entry}` is not host or host:port"))
            })?;
            Ok(AllowedHost::Host {
                host: host.to_ascii_lowercase(),
                port,
            })
        })
        .collect()
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port`; None unless the host is a DNS
/// name or an IP address and the port is 1 to 65535.
pub fn split_host_port(entry: &str) -> Option<(String, Option<u16>)> {
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p > 0);
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(port(p)?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    let (host, port) = match entry.rsplit_once(':') {
        Some((host, p)) if !host.contains(':') => (host, Some(port(p)?)),
        Some(_) => {
            // A bare IPv6 address.
            entry.parse::<std::net::Ipv6Addr>().ok()?;
            return Some((entry.to_string(), None));
        }
        None => (entry, None),
    };
    let dns_name = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    dns_name.then(|| (host.to_string(), port))
}

fn default_host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{name}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_numbers_in_unit_and_strings() {
        assert_eq!(
            parse_duration("1500", MS).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("2.5", SECOND).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            parse_duration("500ms", SECOND).unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("3m", MS).unwrap(), Duration::from_secs(180));
        assert!(parse_duration("soon", MS).is_err());
        assert!(parse_duration("-1", MS).is_err());
        assert!(parse_duration("1e30", SECOND).is_err());
    }

    #[test]
    fn memory_sizes_are_read_as_redis_reads_them() {
        assert_eq!(parse_memory_size("512MB").unwrap(), "512mb");
        assert_eq!(parse_memory_size(" 1048576 ").unwrap(), "1048576");
        assert_eq!(parse_memory_size("4g").unwrap(), "4g");
        for bad in [
            "",
            "mb",
            "0",
            "-5mb",
            "1.5gb",
            "12tb",
            "1 gb",
            "99999999999999999999",
        ] {
            assert!(parse_memory_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn history_may_be_bounded_by_a_size_as_redis_writes_sizes() {
        assert_eq!(Config::default().history_max_bytes, None);
        let with = |text: &str| {
            Config::resolve(&ServeArgs {
                history_max_bytes: Some(text.into()),
                ..ServeArgs::default()
            })
        };
        assert_eq!(with("512mb").unwrap().history_max_bytes, Some(512 << 20));
        assert_eq!(with("2G").unwrap().history_max_bytes, Some(2_000_000_000));
        assert_eq!(with("4096").unwrap().history_max_bytes, Some(4096));
        for bad in [
            "0",
            "-1mb",
            "much",
            "1.5gb",
            "1 gb",
            "99999999999999999999gb",
        ] {
            assert!(with(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn history_may_be_bounded_by_a_count_of_one_or_more() {
        assert_eq!(Config::default().history_max_lives, None);
        let with = |text: &str| {
            Config::resolve(&ServeArgs {
                history_max_lives: Some(text.into()),
                ..ServeArgs::default()
            })
        };
        assert_eq!(with("1000").unwrap().history_max_lives, Some(1000));
        for bad in ["0", "-1", "many", "1.5"] {
            assert!(with(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_manual_clock_is_for_loopback_listens_only() {
        assert!(!Config::default().manual_clock);
        let manual = |listen: &str| {
            Config::resolve(&ServeArgs {
                clock: Some("manual".into()),
                listen: Some(listen.into()),
                api_tokens: Some("t:admin".into()),
                ..Default::default()
            })
        };
        assert!(manual("127.0.0.1:8080").unwrap().manual_clock);
        let refused = manual("0.0.0.0:8080").unwrap_err().0;
        assert!(refused.contains("loopback"), "{refused}");
        let unknown = Config::resolve(&ServeArgs {
            clock: Some("fast".into()),
            ..Default::default()
        })
        .unwrap_err()
        .0;
        assert!(unknown.contains("system"), "{unknown}");
    }

    #[test]
    fn durability_is_everysec_unless_always_is_asked() {
        assert_eq!(Config::default().durability, "everysec");
        assert!(!Config::default().allow_eviction);
        let args = ServeArgs {
            durability: Some("always".into()),
            ..ServeArgs::default()
        };
        assert_eq!(Config::resolve(&args).unwrap().durability, "always");
        let args = ServeArgs {
            durability: Some("never".into()),
            ..ServeArgs::default()
        };
        assert!(Config::resolve(&args).is_err());
    }

    #[test]
    fn defaults_match_the_spec() {
        let c = Config::default();
        assert_eq!(c.booking_plan_watch_interval, Duration::from_secs(10));
        assert_eq!(c.preset_execution_time, Duration::from_secs(300));
        assert_eq!(c.minimum_life_term, Duration::from_secs(180));
        assert_eq!(c.execution_guard_time, Duration::from_secs(30));
        assert_eq!(c.execution_delay_guard_time, Duration::from_secs(3600));
        assert_eq!(c.birth_delay_limit_time, Duration::from_secs(180));
        assert_eq!(c.death_retry_interval, Duration::from_secs(60));
        assert_eq!(c.history_retention, Duration::from_secs(86_400));
        assert_eq!(c.timedout_queue_max_size, 256);
        assert_eq!(c.execution_retry_codes, vec![429, 500, 502, 503, 504, 599]);
        assert_eq!(c.key_prefix, "kairos");
        assert_eq!(c.timezone, chrono_tz::UTC);
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.max_body_bytes, 1 << 20);
    }

    #[test]
    fn file_values_apply_and_flags_win() {
        let dir = std::env::temp_dir().join(format!("kairos-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kairos.toml");
        std::fs::write(
            &path,
            "minimum_life_term = \"1m\"\nexecution_guard_time = 5000\ntimezone = \"Asia/Tokyo\"\nexecution_retry_codes = [503, 599]\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path.clone()),
            execution_guard_time: Some("2s".into()),
            ..Default::default()
        };
        let c = Config::resolve(&args).unwrap();
        assert_eq!(c.minimum_life_term, Duration::from_secs(60));
        assert_eq!(c.execution_guard_time, Duration::from_secs(2));
        assert_eq!(c.timezone, chrono_tz::Asia::Tokyo);
        assert_eq!(c.execution_retry_codes, vec![503, 599]);

        std::fs::write(&path, "no_such_parameter = 1\n").unwrap();
        let err = Config::resolve(&args).unwrap_err();
        assert!(err.0.contains("no_such_parameter"), "{err}");
    }

    #[test]
    fn tokens_and_allowlist_parse() {
        let tokens = parse_tokens("a:read, b:book,c:admin").unwrap();
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens[2].scope, Scope::Admin);
        assert!(parse_tokens("x:root").is_err());
        // A name before `@` is what the audit log shows; without one, a fingerprint.
        let named = parse_tokens("ci@s3cr=t:book, s3cr=t:read").unwrap();
        assert_eq!(
            (named[0].name.as_str(), named[0].token.as_str()),
            ("ci", "s3cr=t")
        );
        assert!(named[1].name.starts_with("token-") && named[1].name.len() == 14);
        assert!(!named[1].name.contains("s3cr"));
        assert_eq!(named[1].token, "s3cr=t");
        assert!(parse_tokens("ci@:book").is_err());
        let hosts = parse_allowed_hosts("*,example.com:8443,Localhost,[::1]:80").unwrap();
        assert_eq!(hosts[0], AllowedHost::AnyPublic);
        assert_eq!(
            hosts[1],
            AllowedHost::Host {
                host: "example.com".into(),
                port: Some(8443)
            }
        );
        assert_eq!(
            hosts[2],
            AllowedHost::Host {
                host: "localhost".into(),
                port: None
            }
        );
        assert_eq!(
            hosts[3],
            AllowedHost::Host {
                host: "::1".into(),
                port: Some(80)
            }
        );
    }

    #[test]
    fn open_listen_is_refused_without_tokens() {
        let mut c = Config::default();
        assert!(!c.refuses_open_listen());
        c.listen = "0.0.0.0:8080".parse().unwrap();
        assert!(c.refuses_open_listen());
        c.insecure = true;
        assert!(!c.refuses_open_listen());
    }

    #[test]
    fn a_key_prefix_with_a_hash_tag_is_refused() {
        for prefix in ["{kairos}", "kairos{a}", "k}"] {
            let refused = Config::resolve(&ServeArgs {
                key_prefix: Some(prefix.into()),
                ..ServeArgs::default()
            });
            assert!(
                refused.is_err_and(|e| e.0.contains("one Redis Cluster slot")),
                "{prefix}"
            );
        }
        let plain = Config::resolve(&ServeArgs {
            key_prefix: Some("tenant-a".into()),
            ..ServeArgs::default()
        });
        assert_eq!(plain.unwrap().key_prefix, "tenant-a");
    }
}
