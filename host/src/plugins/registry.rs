//! The plugin registry in Redis: names, versions, limits and component bytes.
//!
//! Keys (under `{prefix}:{plugins}:`, one Redis Cluster slot, see docs/redis-layout.md):
//! - `plugins`: set of registered names;
//! - `plugin:{name}`: hash of the latest version (`version`, `digest`, `size`,
//!   `allowed_hosts`, `memory_mb`, `timeout_ms`, `uploaded_at`, `uploaded_at_ms`, and
//!   `input_schema` when the component declares one);
//! - `plugin:{name}:v{n}`: the same hash for every version, changed only when a version
//!   that answered its upload before its compile ended (`state` `compiling`) is ended;
//! - `wasm:{sha256}`: the component's bytes, shared by every version with that digest;
//! - `wasm-refs`: hash of digest → number of versions that use it;
//! - `plugin-versions`: hash of name → the last version ever given to it, kept through a
//!   DELETE so that a version number never names two different uploads.
//!
//! The Lives booked with a plugin are in their shards (`plugin-lives:{name}`), which
//! `DELETE` counts through the store before it deletes.
//!
//! Every host reads the registry when a plugin action fires, so a new upload is used by
//! the next firing on every host without a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::{AsyncCommands, Script};
use serde::{Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use super::input::{
    check_input, compile_input_schema, InputValidator, InputViolation, KnownPlugins,
};
use super::input::{compiled_or_warn, MAX_CACHED_VALIDATORS};
use crate::error::ApiError;
use crate::store::Conn;

/// One version of a plugin, as registered.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PluginMeta {
    pub name: String,
    pub version: u32,
    /// SHA-256 of the component bytes, hex.
    pub digest: String,
    pub size: u64,
    /// Hosts the plugin may call, as given at upload (`host` or `host:port`, or `*`).
    pub allowed_hosts: Vec<String>,
    pub memory_mb: u32,
    pub timeout_ms: u64,
    pub uploaded_at: String,
    pub uploaded_at_ms: i64,
    /// The JSON Schema the component declares for its input (WIT 0.2 `input-schema`),
    /// which bookings are checked against; absent when it declares none.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "schema_as_json"
    )]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<String>,
    /// `ready`; `compiling` while a large component compiles after its upload answered
    /// (bookings naming it wait for it, and `name` goes on naming the version before
    /// until it is ready); `failed` when it turned out unusable (`error` says why).
    pub state: PluginState,
    /// Why a `failed` version cannot be used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a plugin version stands: `ready`, `compiling` (after an upload that answered
/// before its compile ended) or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PluginState {
    Ready,
    Compiling,
    Failed,
}

impl PluginState {
    fn from_field(field: Option<&str>) -> PluginState {
        match field {
            Some("compiling") => PluginState::Compiling,
            Some("failed") => PluginState::Failed,
            _ => PluginState::Ready,
        }
    }
}

/// How long a booking naming a version that is still compiling waits for it.
const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Writes a stored schema text as the JSON it is.
fn schema_as_json<S: Serializer>(schema: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let value = schema
        .as_deref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok());
    value.serialize(s)
}

impl PluginMeta {
    fn from_hash(h: &HashMap<String, String>) -> Option<PluginMeta> {
        let get = |k: &str| h.get(k).cloned();
        Some(PluginMeta {
            name: get("name")?,
            version: get("version")?.parse().ok()?,
            digest: get("digest")?,
            size: get("size")?.parse().ok()?,
            allowed_hosts: get("allowed_hosts")
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            memory_mb: get("memory_mb")?.parse().ok()?,
            timeout_ms: get("timeout_ms")?.parse().ok()?,
            uploaded_at: get("uploaded_at").unwrap_or_default(),
            uploaded_at_ms: get("uploaded_at_ms")?.parse().ok()?,
            input_schema: get("input_schema"),
            state: PluginState::from_field(h.get("state").map(String::as_str)),
            error: get("error"),
        })
    }
}

/// The limits given with an upload.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadLimits {
    pub allowed_hosts: Vec<String>,
    pub memory_mb: u32,
    pub timeout_ms: u64,
}

/// What `DELETE /plugins/{name}` found.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// Deleted; the number of unfinished Lives and timers that still name it (0 unless
    /// forced).
    Deleted {
        unfinished: u64,
    },
    Missing,
    /// Refused: this many unfinished Lives and timers use it.
    InUse {
        unfinished: u64,
    },
}

/// A plugin name: 1 to 64 of `a-z 0-9 - _`, starting with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Splits `name` or `name@version`. The name must be valid: it becomes part of a key, and
/// `noop:lives` would otherwise name the set of Lives that use `noop`.
pub fn split_spec(spec: &str) -> Result<(&str, Option<u32>), String> {
    let name = spec.split_once('@').map_or(spec, |(name, _)| name);
    if !valid_name(name) {
        return Err(format!(
            "`{spec}`: a plugin name is 1 to 64 of a-z, 0-9, - and _, starting with a letter or digit"
        ));
    }
    match spec.split_once('@') {
        None => Ok((spec, None)),
        Some((name, v)) => v
            .parse::<u32>()
            .ok()
            .filter(|v| *v > 0)
            .map(|v| (name, Some(v)))
            .ok_or_else(|| format!("`{spec}`: the version after @ must be a number from 1")),
    }
}

pub fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Reads and writes the registry keys.
#[derive(Clone)]
pub struct Registry {
    conn: Conn,
    /// `{key_prefix}:{plugins}:`.
    prefix: String,
    put: Arc<Script>,
    delete: Arc<Script>,
    promote: Arc<Script>,
    /// Each component digest's compiled input schema (None: it declares none).
    validators: Arc<Mutex<HashMap<String, Option<InputValidator>>>>,
}

impl Registry {
    pub fn new(conn: Conn, prefix: String) -> Self {
        Registry {
            conn,
            prefix,
            put: Arc::new(Script::new(include_str!("scripts/put.lua"))),
            delete: Arc::new(Script::new(include_str!("scripts/delete.lua"))),
            promote: Arc::new(Script::new(include_str!("scripts/promote.lua"))),
            validators: Arc::default(),
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn latest_key(&self, name: &str) -> String {
        self.key(&format!("plugin:{name}"))
    }

    fn version_key(&self, name: &str, version: u32) -> String {
        self.key(&format!("plugin:{name}:v{version}"))
    }

    /// Stores a new version of `name`: checked by the runtime (`Ready`, with its input
    /// schema), or still compiling (`Compiling`: the latest version stays the one before
    /// until [`Registry::promote`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn put(
        &self,
        name: &str,
        bytes: &[u8],
        input_schema: Option<&str>,
        state: PluginState,
        limits: &UploadLimits,
        uploaded_at: &str,
        uploaded_at_ms: i64,
    ) -> Result<PluginMeta, ApiError> {
        let digest = digest_of(bytes);
        let mut conn = self.conn.clone();
        let allowed = limits.allowed_hosts.join(",");
        let version: u32 = self
            .put
            .key(self.key("plugins"))
            .key(self.latest_key(name))
            .key(self.key("wasm-refs"))
            .key(self.key(&format!("wasm:{digest}")))
            .arg(&self.prefix)
            .arg(name)
            .arg(&digest)
            .arg(bytes.len())
            .arg(&allowed)
            .arg(limits.memory_mb)
            .arg(limits.timeout_ms)
            .arg(uploaded_at)
            .arg(uploaded_at_ms)
            .arg(bytes)
            .arg(input_schema.unwrap_or(""))
            .arg(if state == PluginState::Compiling {
                "compiling"
            } else {
                ""
            })
            .invoke_async(&mut conn)
            .await?;
        Ok(PluginMeta {
            name: name.to_string(),
            version,
            digest,
            size: bytes.len() as u64,
            allowed_hosts: limits.allowed_hosts.clone(),
            memory_mb: limits.memory_mb,
            timeout_ms: limits.timeout_ms,
            uploaded_at: uploaded_at.to_string(),
            uploaded_at_ms,
            input_schema: input_schema.map(String::from),
            state,
            error: None,
        })
    }

    /// Ends the compile of version `version` of `name` (digest `digest`): ready with
    /// its input schema, it becomes the latest unless a newer one is; failed, it keeps
    /// the error. False when it was no longer compiling (another host ended it, or the
    /// plugin was deleted).
    pub async fn promote(
        &self,
        name: &str,
        version: u32,
        digest: &str,
        outcome: Result<Option<&str>, &str>,
    ) -> Result<bool, ApiError> {
        let (state, text) = match outcome {
            Ok(schema) => ("ready", schema.unwrap_or("")),
            Err(why) => ("failed", why),
        };
        let mut conn = self.conn.clone();
        let written: i64 = self
            .promote
            .key(self.latest_key(name))
            .key(self.version_key(name, version))
            .arg(state)
            .arg(text)
            .arg(digest)
            .invoke_async(&mut conn)
            .await?;
        Ok(written == 1)
    }

    /// The newest version of `name`, whatever its state.
    pub async fn newest(&self, name: &str) -> Result<Option<PluginMeta>, ApiError> {
        let mut conn = self.conn.clone();
        let last: Option<u32> = conn.hget(self.key("plugin-versions"), name).await?;
        let latest = self.resolve(name).await?;
        self.newer_than(name, latest, last).await
    }

    /// The version `last` of `name` (the last number given to it) when it is newer than
    /// `latest`, the latest ready one; else `latest`. Only then is a second read made.
    async fn newer_than(
        &self,
        name: &str,
        latest: Option<PluginMeta>,
        last: Option<u32>,
    ) -> Result<Option<PluginMeta>, ApiError> {
        match last {
            Some(n) if latest.as_ref().is_none_or(|l| n > l.version) => {
                let mut conn = self.conn.clone();
                let hash: HashMap<String, String> = conn.hgetall(self.version_key(name, n)).await?;
                Ok(PluginMeta::from_hash(&hash).or(latest))
            }
            _ => Ok(latest),
        }
    }

    /// The version a spec names (`name` = latest, `name@3` = version 3), if registered.
    /// A malformed spec names nothing (rather than failing like an unreachable Redis,
    /// which a run retries).
    pub async fn resolve(&self, spec: &str) -> Result<Option<PluginMeta>, ApiError> {
        let Ok((name, version)) = split_spec(spec) else {
            return Ok(None);
        };
        let key = match version {
            None => self.latest_key(name),
            Some(v) => self.version_key(name, v),
        };
        let mut conn = self.conn.clone();
        let hash: HashMap<String, String> = conn.hgetall(key).await?;
        Ok(PluginMeta::from_hash(&hash))
    }

    /// The `specs` that are registered, with their input schemas: one round trip for
    /// the versions' digests, and a second only for digests this host has not seen (a
    /// component's schema never changes, so each is read and compiled once per host).
    ///
    /// A spec naming a version still compiling (`name@n`, or `name` whose only version
    /// is) waits for its compile, up to [`COMPILE_WAIT`]: its input schema is not known
    /// before. A version that failed is not registered.
    pub async fn registered(&self, specs: Vec<String>) -> Result<KnownPlugins, ApiError> {
        if specs.is_empty() {
            return Ok(KnownPlugins::default());
        }
        let deadline = std::time::Instant::now() + COMPILE_WAIT;
        // Bounded by the deadline; the count only guards against a clock that stands still.
        for _ in 0..10_000 {
            match self.registered_once(&specs).await? {
                Ok(known) => return Ok(known),
                Err(compiling) if std::time::Instant::now() < deadline => {
                    tracing::debug!(plugin = %compiling, "waiting for a plugin to compile");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(compiling) => {
                    return Err(ApiError::new(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "plugin_compiling",
                        format!("plugin `{compiling}` is still compiling after its upload; try again shortly"),
                    ))
                }
            }
        }
        Err(ApiError::new(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "plugin_compiling",
            "a plugin is still compiling after its upload; try again shortly",
        ))
    }

    /// One look at the registry for [`Registry::registered`]: Err(spec) when a spec
    /// names a version still compiling.
    async fn registered_once(
        &self,
        specs: &[String],
    ) -> Result<Result<KnownPlugins, String>, ApiError> {
        let keys: Vec<String> = specs
            .iter()
            .map(|spec| match split_spec(spec) {
                Ok((name, None)) => self.latest_key(name),
                Ok((name, Some(v))) => self.version_key(name, v),
                Err(_) => self.key("plugin-spec-that-cannot-exist:"),
            })
            .collect();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("HMGET").arg(key).arg("digest").arg("state");
        }
        let mut conn = self.conn.clone();
        let found: Vec<(Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
        let mut known = KnownPlugins::default();
        let mut unseen = Vec::new();
        for ((spec, key), (digest, state)) in specs.iter().zip(keys).zip(found) {
            match (digest, PluginState::from_field(state.as_deref())) {
                (_, PluginState::Compiling) => return Ok(Err(spec.clone())),
                (Some(_), PluginState::Failed) => {}
                (Some(digest), PluginState::Ready) => {
                    let cached = self
                        .validators
                        .lock()
                        .expect("validators")
                        .get(&digest)
                        .cloned();
                    match cached {
                        Some(validator) => {
                            known.0.insert(spec.clone(), validator);
                        }
                        None => unseen.push((spec.clone(), key, digest)),
                    }
                }
                (None, _) => {
                    // A new name whose first version is still compiling has no latest yet.
                    if let Ok((name, None)) = split_spec(spec) {
                        let newest = self.newest(name).await?;
                        if newest.is_some_and(|m| m.state == PluginState::Compiling) {
                            return Ok(Err(spec.clone()));
                        }
                    }
                }
            }
        }
        if !unseen.is_empty() {
            let mut pipe = redis::pipe();
            for (_, key, _) in &unseen {
                pipe.hget(key, "input_schema");
            }
            let schemas: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
            for ((spec, _, digest), schema) in unseen.into_iter().zip(schemas) {
                let validator = schema.and_then(|text| compiled_or_warn(&digest, &text));
                let mut cache = self.validators.lock().expect("validators");
                if cache.len() >= MAX_CACHED_VALIDATORS {
                    cache.clear();
                }
                cache.insert(digest, validator.clone());
                known.0.insert(spec, validator);
            }
        }
        Ok(Ok(known))
    }

    /// The component bytes of a digest.
    pub async fn bytes(&self, digest: &str) -> Result<Option<Vec<u8>>, ApiError> {
        let mut conn = self.conn.clone();
        Ok(conn.get(self.key(&format!("wasm:{digest}"))).await?)
    }

    /// The last version number given to each name (`plugin-versions`): it changes with
    /// every upload, so a host that reads it now and then learns of new versions.
    pub async fn version_counters(&self) -> Result<HashMap<String, String>, ApiError> {
        let mut conn = self.conn.clone();
        Ok(conn.hgetall(self.key("plugin-versions")).await?)
    }

    /// Every plugin's newest version, by name: the latest one, or a newer one still
    /// compiling or failed.
    pub async fn list(&self) -> Result<Vec<PluginMeta>, ApiError> {
        let mut conn = self.conn.clone();
        let mut names: Vec<String> = conn.smembers(self.key("plugins")).await?;
        names.sort();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.hgetall(self.latest_key(name));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        let counters = self.version_counters().await?;
        let mut out = Vec::new();
        for (name, hash) in names.iter().zip(&hashes) {
            let last: Option<u32> = counters.get(name).and_then(|n| n.parse().ok());
            out.extend(
                self.newer_than(name, PluginMeta::from_hash(hash), last)
                    .await?,
            );
        }
        Ok(out)
    }

    /// Versions still compiling behind a newer upload of their name (the newest version
    /// of each name is in [`Registry::list`]): their compile is ended by whichever host
    /// warms them, so that one whose uploading host died does not stay `compiling`.
    pub async fn compiling_behind(&self) -> Result<Vec<PluginMeta>, ApiError> {
        let counters = self.version_counters().await?;
        let names: Vec<&String> = counters.keys().collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.hget(self.latest_key(name), "version");
        }
        let mut conn = self.conn.clone();
        let latest: Vec<Option<u32>> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        let mut any = false;
        for (name, latest) in names.iter().zip(latest) {
            let newest: u32 = counters[*name].parse().unwrap_or(0);
            // Bounded: a name's versions between its latest ready one and its newest.
            for v in (latest.unwrap_or(0) + 1..newest).take(100) {
                pipe.hgetall(self.version_key(name, v));
                any = true;
            }
        }
        if !any {
            return Ok(Vec::new());
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        Ok(hashes
            .iter()
            .filter_map(PluginMeta::from_hash)
            .filter(|m| m.state == PluginState::Compiling)
            .collect())
    }

    /// Every version of `name`, oldest first (empty when unknown).
    pub async fn versions(&self, name: &str) -> Result<Vec<PluginMeta>, ApiError> {
        let Some(newest) = self.newest(name).await? else {
            return Ok(Vec::new());
        };
        let mut pipe = redis::pipe();
        for v in 1..=newest.version {
            pipe.hgetall(self.version_key(name, v));
        }
        let mut conn = self.conn.clone();
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        Ok(hashes.iter().filter_map(PluginMeta::from_hash).collect())
    }

    /// Deletes `name` and all its versions, unless `unfinished` Lives and timers use it
    /// (the store counts them across the shards) and `force` is false.
    pub async fn delete(
        &self,
        name: &str,
        force: bool,
        unfinished: u64,
    ) -> Result<DeleteOutcome, ApiError> {
        let mut conn = self.conn.clone();
        let (word, unfinished): (String, u64) = self
            .delete
            .key(self.key("plugins"))
            .key(self.latest_key(name))
            .key(self.key("wasm-refs"))
            .arg(&self.prefix)
            .arg(name)
            .arg(if force { "1" } else { "0" })
            .arg(unfinished)
            .invoke_async(&mut conn)
            .await?;
        Ok(match word.as_str() {
            "missing" => DeleteOutcome::Missing,
            "in_use" => DeleteOutcome::InUse { unfinished },
            _ => DeleteOutcome::Deleted { unfinished },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_specs() {
        assert!(valid_name("http-forward"));
        assert!(valid_name("a1_b"));
        assert!(!valid_name(""));
        assert!(!valid_name("-x"));
        assert!(!valid_name("Upper"));
        assert!(!valid_name("a:b"));
        assert!(!valid_name(&"a".repeat(65)));
        assert_eq!(split_spec("chain").unwrap(), ("chain", None));
        assert_eq!(split_spec("chain@3").unwrap(), ("chain", Some(3)));
        assert!(split_spec("chain@0").is_err());
        assert!(split_spec("chain@x").is_err());
        assert!(split_spec("chain@").is_err());
        assert!(split_spec("chain@99999999999").is_err());
        assert!(split_spec("chain:lives").is_err());
        assert!(split_spec("chain:v1@1").is_err());
        assert!(split_spec("").is_err());
        assert!(split_spec("@1").is_err());
    }
}
