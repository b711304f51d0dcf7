//! The nouns of SPEC section 1: Lives, Plans, their states, and actions.
//!
//! These types are what the store writes to Redis (as plain strings) and what the API
//! shows. Transitions between states happen only inside the store's Lua scripts, so a
//! reader of `store/scripts/*.lua` sees every state machine edge.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// The name stored in Redis and shown by the API.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!(concat!("`{}` is not a ", stringify!($name)), other)),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// Whether a Life has one action or a start and an end.
    ScheduleType {
        /// One action at `birth_time`.
        Point => "point",
        /// A birth action at `birth_time` and a death action at `death_time`.
        Term => "term",
    }
}

string_enum! {
    /// State of a Life (SPEC section 1).
    LifeState {
        /// Booked; birth not yet done.
        Inexistent => "Inexistent",
        /// Term only: birth done, death pending.
        Alive => "Alive",
        /// The last action completed.
        Dead => "Dead",
        /// Cancelled before birth, or birth failed for good.
        Stillbirth => "Stillbirth",
        /// Birth missed by more than `birth_delay_limit_time`.
        Invalidated => "Invalidated",
    }
}

impl LifeState {
    /// Finished Lives no longer change, hold no resource and are swept after retention.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            LifeState::Dead | LifeState::Stillbirth | LifeState::Invalidated
        )
    }
}

string_enum! {
    /// Which action of a Life a Plan fires.
    PlanKind {
        Birth => "birth",
        Death => "death",
    }
}

string_enum! {
    /// State of a Plan (SPEC section 1).
    PlanState {
        /// Waiting in the due set.
        Standby => "Standby",
        /// Claimed by a host into its in-memory timer, under that host's lease.
        Preset => "Preset",
        /// Its action is running.
        Running => "Running",
        Done => "Done",
        Failed => "Failed",
        Invalidated => "Invalidated",
        Cancelled => "Cancelled",
    }
}

/// What a Plan does when it fires. Stored in its Plan's fields (a Life's hash, or a
/// timer's or task's Plan hash) as compact JSON: a plugin action is told apart by its
/// `plugin` field, and zero defaults are left out, so that a small action stays under
/// Redis's `hash-max-listpack-value` (64 bytes by default) and the hash keeps the compact
/// listpack encoding. Read back in one pass by [`ActionWire`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Action {
    /// A WebAssembly component plugin.
    Plugin(PluginAction),
    /// The built-in HTTP webhook.
    Webhook(WebhookAction),
}

impl Action {
    /// The actions to run when this one's Plan finishes for good.
    pub fn callbacks(&self) -> &Callbacks {
        match self {
            Action::Webhook(w) => &w.callbacks,
            Action::Plugin(p) => &p.callbacks,
        }
    }

    /// This action as a callback for `outcome`: the outcome is its body (a webhook) or
    /// its input (a plugin).
    pub fn with_outcome(&self, outcome: serde_json::Value) -> Action {
        match self {
            Action::Webhook(w) => Action::Webhook(WebhookAction {
                body: Some(outcome),
                callbacks: Callbacks::default(),
                ..w.clone()
            }),
            Action::Plugin(p) => Action::Plugin(PluginAction {
                input: outcome,
                callbacks: Callbacks::default(),
                ..p.clone()
            }),
        }
    }

    /// How many times a failed run is retried before the Plan fails.
    pub fn retry_count(&self) -> u32 {
        match self {
            Action::Webhook(w) => w.retry_count,
            Action::Plugin(p) => p.retry_count,
        }
    }

    /// Pause between retries.
    pub fn retry_interval_ms(&self) -> u64 {
        match self {
            Action::Webhook(w) => w.retry_interval_ms,
            Action::Plugin(p) => p.retry_interval_ms,
        }
    }
}

/// A stored action as it is read: the fields of both kinds in one struct, so that a record
/// is read in one pass. (serde's `untagged` and `flatten` would buffer each action whole
/// and try each kind in turn; a listing reads fifty records a page.) A `plugin` field
/// makes it a plugin call, as the untagged enum told them apart; unknown fields are
/// ignored, as `flatten` ignored them. Clients' actions are read by
/// `bookings::request::RawAction`, with its own errors, not by this.
#[derive(Deserialize)]
struct ActionWire {
    plugin: Option<String>,
    input: Option<serde_json::Value>,
    timeout_ms: Option<u64>,
    path: Option<String>,
    url: Option<String>,
    method: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<serde_json::Value>,
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    #[serde(default)]
    retry_count: u32,
    #[serde(default)]
    retry_interval_ms: u64,
    on_success: Option<Box<Action>>,
    on_failure: Option<Box<Action>>,
}

impl<'de> Deserialize<'de> for Action {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Action, D::Error> {
        let w = ActionWire::deserialize(d)?;
        let callbacks = Callbacks {
            on_success: w.on_success,
            on_failure: w.on_failure,
        };
        if let Some(plugin) = w.plugin {
            return Ok(Action::Plugin(PluginAction {
                plugin,
                input: w.input.unwrap_or_default(),
                timeout_ms: w.timeout_ms,
                retry_count: w.retry_count,
                retry_interval_ms: w.retry_interval_ms,
                callbacks,
            }));
        }
        let Some(method) = w.method else {
            return Err(serde::de::Error::missing_field("method"));
        };
        Ok(Action::Webhook(WebhookAction {
            path: w.path,
            url: w.url,
            method,
            headers: w.headers,
            body: w.body,
            connect_timeout_ms: w.connect_timeout_ms,
            request_timeout_ms: w.request_timeout_ms,
            retry_count: w.retry_count,
            retry_interval_ms: w.retry_interval_ms,
            callbacks,
        }))
    }
}

/// A webhook call. Exactly one of `path` (joined to the gateway) and `url` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookAction {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub url: Option<String>,
    pub method: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub headers: BTreeMap<String, String>,
    /// The body as sent: a JSON value is sent as JSON, a string as-is.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub body: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub connect_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub request_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub retry_count: u32,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub retry_interval_ms: u64,
    #[serde(flatten)]
    pub callbacks: Callbacks,
}

/// Actions run once with the outcome when the Plan of the action that carries them
/// finishes for good (QStash's callbacks): `on_success` after a success, `on_failure`
/// after the last retry failed. A callback is booked as a point Life due at once, in the
/// same write that records the outcome; its body (a webhook) or input (a plugin) is the
/// outcome. A callback has no callbacks of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Callbacks {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub on_success: Option<Box<Action>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub on_failure: Option<Box<Action>>,
}

impl Callbacks {
    pub fn is_empty(&self) -> bool {
        self.on_success.is_none() && self.on_failure.is_none()
    }
}

/// A plugin call (SPEC section 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginAction {
    /// `name` or `name@version`.
    pub plugin: String,
    #[serde(default)]
    pub input: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub retry_count: u32,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub retry_interval_ms: u64,
    #[serde(flatten)]
    pub callbacks: Callbacks,
}

/// How a timer's runs go (stored as the `opts` JSON of its Plan; Lives and queue tasks
/// have none and take the defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOpts {
    /// 1 (high) to 4 (low): among runs waiting for a worker, a lower number goes first.
    /// Plans without one rank as 2.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub priority: Option<u8>,
    /// Retries of a failed run (codes in `execution_retry_codes`) before it counts as
    /// failed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub retries: Option<u32>,
    /// Wall-clock bound of one run.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub timeout_ms: Option<u64>,
    /// A timer's first attempt that would start more than this after its fire time is
    /// not run but logged as skipped (its `starting_deadline`, or its catch-up window).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub skip_if_late_ms: Option<u64>,
    /// A timer's `overlap: cancel_running`: a run still going when the timer's next slot
    /// comes is cut off then, recorded as cancelled, and that slot runs at once.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub cancel_at_next_slot: bool,
}

impl RunOpts {
    /// The rank among waiting runs (1 first).
    pub fn rank(&self) -> u8 {
        self.priority.unwrap_or(2)
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// A validated booking, ready for the store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLife {
    pub life_uuid: String,
    pub schedule_type: ScheduleType,
    pub resource_id: Option<String>,
    pub birth_at_ms: i64,
    /// Set for term Lives only.
    pub death_at_ms: Option<i64>,
    pub birth_action: Action,
    /// Set for term Lives only.
    pub death_action: Option<Action>,
}

impl NewLife {
    /// The last fire time: death for a term, birth for a point.
    pub fn end_at_ms(&self) -> i64 {
        self.death_at_ms.unwrap_or(self.birth_at_ms)
    }
}

/// Retries of a failed timer run when the timer does not say.
pub const DEFAULT_TIMER_RETRIES: u32 = 3;

/// Names of timers, queues and tasks: they are part of Redis keys.
pub fn check_name(what: &str, name: &str, max_len: usize) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= max_len
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_name",
            format!("{what} `{name}` must be 1 to {max_len} letters, digits, `-` or `_`"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for s in ["Inexistent", "Alive", "Dead", "Stillbirth", "Invalidated"] {
            assert_eq!(s.parse::<LifeState>().unwrap().as_str(), s);
        }
        for s in [
            "Standby",
            "Preset",
            "Running",
            "Done",
            "Failed",
            "Invalidated",
            "Cancelled",
        ] {
            assert_eq!(s.parse::<PlanState>().unwrap().as_str(), s);
        }
        assert!("alive".parse::<LifeState>().is_err());
        assert!(LifeState::Stillbirth.is_finished());
        assert!(!LifeState::Alive.is_finished());
    }

    #[test]
    fn actions_serialize_compactly() {
        let a = Action::Webhook(WebhookAction {
            path: Some("/tasks".into()),
            url: None,
            method: "POST".into(),
            headers: BTreeMap::new(),
            body: Some(serde_json::json!({"id": "a0"})),
            connect_timeout_ms: None,
            request_timeout_ms: None,
            retry_count: 0,
            retry_interval_ms: 0,
            callbacks: Callbacks::default(),
        });
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"path":"/tasks","method":"POST","body":{"id":"a0"}}"#
        );
        let back: Action = serde_json::from_str(&text).unwrap();
        assert_eq!(back, a);
        let plugin = Action::Plugin(PluginAction {
            plugin: "chain@2".into(),
            input: serde_json::json!({"k": 1}),
            timeout_ms: None,
            retry_count: 3,
            retry_interval_ms: 0,
            callbacks: Callbacks::default(),
        });
        let text = serde_json::to_string(&plugin).unwrap();
        assert_eq!(
            text,
            r#"{"plugin":"chain@2","input":{"k":1},"retry_count":3}"#
        );
        assert_eq!(serde_json::from_str::<Action>(&text).unwrap(), plugin);
    }

    /// The one-pass read gives back every field of both kinds, callbacks nested in
    /// either, as the untagged enum did.
    #[test]
    fn actions_read_back_whole() {
        let on_failure = Action::Plugin(PluginAction {
            plugin: "alert".into(),
            input: serde_json::Value::Null,
            timeout_ms: Some(900),
            retry_count: 0,
            retry_interval_ms: 250,
            callbacks: Callbacks::default(),
        });
        let hook = Action::Webhook(WebhookAction {
            path: None,
            url: Some("http://127.0.0.1:9/x".into()),
            method: "PUT".into(),
            headers: BTreeMap::from([("x-a".to_string(), "1".to_string())]),
            body: Some(serde_json::json!("text")),
            connect_timeout_ms: Some(10),
            request_timeout_ms: Some(20),
            retry_count: 2,
            retry_interval_ms: 30,
            callbacks: Callbacks {
                on_success: None,
                on_failure: Some(Box::new(on_failure)),
            },
        });
        let plugin = Action::Plugin(PluginAction {
            plugin: "chain".into(),
            input: serde_json::json!([1, 2]),
            timeout_ms: None,
            retry_count: 1,
            retry_interval_ms: 0,
            callbacks: Callbacks {
                on_success: Some(Box::new(hook.clone())),
                on_failure: None,
            },
        });
        for a in [hook, plugin] {
            let text = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<Action>(&text).unwrap(), a, "{text}");
        }
        // Unknown fields are ignored; a webhook without its method is refused.
        let a: Action = serde_json::from_str(r#"{"path":"/p","method":"GET","later":1}"#).unwrap();
        assert!(matches!(a, Action::Webhook(w) if w.path.as_deref() == Some("/p")));
        let e = serde_json::from_str::<Action>(r#"{"path":"/p"}"#).unwrap_err();
        assert!(e.to_string().contains("method"), "{e}");
    }
}
