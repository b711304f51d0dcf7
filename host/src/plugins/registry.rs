//! The plugin registry in Redis: names, versions, limits and component bytes.
//!
//! Keys (under `{prefix}:{plugins}:`, one Redis Cluster slot, see docs/redis-layout.md):
//! - `plugins`: set of registered names;
//! - `plugin:{name}`: hash of the latest version (`version`, `digest`, `size`,
//!   `allowed_hosts`, `memory_mb`, `timeout_ms`, `uploaded_at`, `uploaded_at_ms`);
//! - `plugin:{name}:v{n}`: the same hash for every version, never changed once written;
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

use redis::{AsyncCommands, Script};
use serde::Serialize;
use sha2::{Digest, Sha256};

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

const PUT_SCRIPT: &str = r#"
-- KEYS: 1 plugins set, 2 latest hash, 3 wasm-refs, 4 wasm:{digest}; ARGV: 1 prefix,
-- 2 name, 3 digest, 4 size, 5 allowed_hosts, 6 memory_mb, 7 timeout_ms, 8 uploaded_at,
-- 9 uploaded_at_ms, 10 the component's bytes.
-- The bytes are stored here, with the reference that keeps them: written apart, a DELETE
-- of the digest's last other user could run in between and remove them.
redis.call('SET', KEYS[4], ARGV[10], 'NX')
local version = redis.call('HINCRBY', ARGV[1] .. 'plugin-versions', ARGV[2], 1)
-- A name uploaded before this counter existed goes on from its latest version.
local latest = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if version <= latest then
  version = latest + 1
  redis.call('HSET', ARGV[1] .. 'plugin-versions', ARGV[2], version)
end
local fields = {'name', ARGV[2], 'version', version, 'digest', ARGV[3], 'size', ARGV[4],
  'allowed_hosts', ARGV[5], 'memory_mb', ARGV[6], 'timeout_ms', ARGV[7],
  'uploaded_at', ARGV[8], 'uploaded_at_ms', ARGV[9]}
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('HSET', ARGV[1] .. 'plugin:' .. ARGV[2] .. ':v' .. version, unpack(fields))
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('SADD', KEYS[1], ARGV[2])
return version
"#;

const DELETE_SCRIPT: &str = r#"
-- KEYS: 1 plugins set, 2 latest hash, 3 wasm-refs;
-- ARGV: 1 prefix, 2 name, 3 force ('1' or '0'), 4 unfinished Lives and timers using it
-- (counted across the shards by the caller)
if redis.call('EXISTS', KEYS[2]) == 0 then return {'missing', 0} end
local unfinished = tonumber(ARGV[4])
if unfinished > 0 and ARGV[3] ~= '1' then return {'in_use', unfinished} end
local latest = tonumber(redis.call('HGET', KEYS[2], 'version'))
for v = 1, latest do
  local key = ARGV[1] .. 'plugin:' .. ARGV[2] .. ':v' .. v
  local digest = redis.call('HGET', key, 'digest')
  if digest then
    if redis.call('HINCRBY', KEYS[3], digest, -1) <= 0 then
      redis.call('HDEL', KEYS[3], digest)
      redis.call('DEL', ARGV[1] .. 'wasm:' .. digest)
    end
    redis.call('DEL', key)
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[1], ARGV[2])
return {'deleted', unfinished}
"#;

/// Reads and writes the registry keys.
#[derive(Clone)]
pub struct Registry {
    conn: Conn,
    /// `{key_prefix}:{plugins}:`.
    prefix: String,
    put: std::sync::Arc<Script>,
    delete: std::sync::Arc<Script>,
}

impl Registry {
    pub fn new(conn: Conn, prefix: String) -> Self {
        Registry {
            conn,
            prefix,
            put: std::sync::Arc::new(Script::new(PUT_SCRIPT)),
            delete: std::sync::Arc::new(Script::new(DELETE_SCRIPT)),
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

    /// Stores a new version of `name`; the bytes have been checked by the runtime.
    pub async fn put(
        &self,
        name: &str,
        bytes: &[u8],
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
        })
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

    /// The `specs` that are registered, in one round trip.
    pub async fn registered(
        &self,
        specs: Vec<String>,
    ) -> Result<std::collections::HashSet<String>, ApiError> {
        let exists = self.existing(&specs).await?;
        Ok(specs
            .into_iter()
            .zip(exists)
            .filter_map(|(spec, yes)| yes.then_some(spec))
            .collect())
    }

    /// Which of `specs` are registered, in one round trip.
    async fn existing(&self, specs: &[String]) -> Result<Vec<bool>, ApiError> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for spec in specs {
            match split_spec(spec) {
                Ok((name, None)) => pipe.exists(self.latest_key(name)),
                Ok((name, Some(v))) => pipe.exists(self.version_key(name, v)),
                Err(_) => pipe.exists(self.key("plugin-spec-that-cannot-exist:")),
            };
        }
        let mut conn = self.conn.clone();
        Ok(pipe.query_async(&mut conn).await?)
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

    /// Every plugin's latest version, by name.
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
        Ok(hashes.iter().filter_map(PluginMeta::from_hash).collect())
    }

    /// Every version of `name`, oldest first (empty when unknown).
    pub async fn versions(&self, name: &str) -> Result<Vec<PluginMeta>, ApiError> {
        let Some(latest) = self.resolve(name).await? else {
            return Ok(Vec::new());
        };
        let mut pipe = redis::pipe();
        for v in 1..=latest.version {
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
