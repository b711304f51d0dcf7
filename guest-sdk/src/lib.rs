//! Write kairos action plugins in Rust.
//!
//! A plugin is one function that takes the firing [`Context`] and a typed input, and
//! returns something serializable or an [`Error`]; one line exports it:
//!
//! ```ignore
//! use kairos_guest::{export_action, http, Context, Error};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Input { url: String }
//!
//! fn run(_ctx: Context, input: Input) -> Result<u16, Error> {
//!     let response = http::get(&input.url)?;
//!     Ok(response.status)
//! }
//!
//! export_action!(run);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` (crate type `cdylib`);
//! the `.wasm` file is a component kairos accepts at `PUT /plugins/{name}`.
//!
//! What a plugin can reach is what the host gives it: [`http`] (through the host's
//! outbound policy and the plugin's `allowed_hosts`), [`log`], the clock ([`now_ms`]) and
//! [`schedule`] for follow-up bookings. There is no filesystem, environment or socket.

use serde::de::DeserializeOwned;
use serde::Serialize;

pub mod http;
pub mod log;
pub mod schedule;
#[cfg(not(target_family = "wasm"))]
pub mod testing;

/// The bindings generated from the `kairos:plugin` WIT package (`wit/` in the kairos
/// repository). Plugins rarely need them directly.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "kairos:plugin/action@0.2.0",
        pub_export_macro: true,
        export_macro_name: "export_action_world",
        default_bindings_module: "kairos_guest::bindings",
        generate_all,
    });
}

use bindings::kairos::plugin0_1_0::types as wit;

/// Which action of a Life is firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// The start action of a term Life, or the only action of a point Life.
    Birth,
    /// The end action of a term Life.
    Death,
}

/// What the host knows about the firing that runs the plugin.
#[derive(Debug, Clone)]
pub struct Context {
    /// The Life's id.
    pub life_id: String,
    /// Which of the Life's actions fires.
    pub plan: PlanKind,
    /// When the Plan was due, in milliseconds since the Unix epoch.
    pub scheduled_at_ms: i64,
    /// 1 for the first run, 2 for the first retry, and so on.
    pub attempt: u32,
    /// The Life's resource, if it has one.
    pub resource_id: Option<String>,
    /// The plugin's registered name.
    pub plugin_name: String,
    /// The plugin version that runs.
    pub plugin_version: u32,
}

impl Context {
    /// The `Idempotency-Key` a webhook of the same Plan sends, `{life_id}:{plan}`
    /// (`birth` or `death`): the same on every retry of the Plan. [`http`]'s requests
    /// that may change something send it (or, after the run's first, `{key}:{n}`) unless
    /// the plugin sets one.
    pub fn idempotency_key(&self) -> String {
        let plan = match self.plan {
            PlanKind::Birth => "birth",
            PlanKind::Death => "death",
        };
        format!("{}:{plan}", self.life_id)
    }
}

impl From<wit::Context> for Context {
    fn from(c: wit::Context) -> Self {
        Context {
            life_id: c.life_id,
            plan: match c.plan {
                wit::PlanKind::Birth => PlanKind::Birth,
                wit::PlanKind::Death => PlanKind::Death,
            },
            scheduled_at_ms: c.scheduled_at_ms,
            attempt: c.attempt,
            resource_id: c.resource_id,
            plugin_name: c.plugin_name,
            plugin_version: c.plugin_version,
        }
    }
}

/// Why a run did not succeed. `retryable` errors are retried by the host as the action's
/// `retry_count` allows; others fail the Plan at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub message: String,
    pub retryable: bool,
}

impl Error {
    /// An error worth trying again later (a target that is down, a rate limit).
    pub fn retryable(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            retryable: true,
        }
    }

    /// An error that will not go away by itself (bad input, a refused request).
    pub fn fatal(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            retryable: false,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// A request that got no answer is worth retrying; one the host refused, or one that
/// could not be made as given, is not ([`http::HttpError::is_retryable`]).
impl From<http::HttpError> for Error {
    fn from(e: http::HttpError) -> Self {
        let retryable = e.is_retryable();
        Error {
            message: e.to_string(),
            retryable,
        }
    }
}

impl From<schedule::BookingError> for Error {
    fn from(e: schedule::BookingError) -> Self {
        Error::fatal(format!("booking refused: {}: {}", e.code, e.message))
    }
}

/// The wall-clock time, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    #[cfg(not(target_family = "wasm"))]
    return testing::now_ms();
    #[cfg(target_family = "wasm")]
    {
        let t = bindings::wasi::clocks::wall_clock::now();
        (t.seconds as i64) * 1000 + i64::from(t.nanoseconds / 1_000_000)
    }
}

/// Glue between the WIT export and a typed plugin function; used by [`export_action!`].
#[doc(hidden)]
pub fn __dispatch<I: DeserializeOwned, O: Serialize>(
    ctx: wit::Context,
    input: &str,
    run: fn(Context, I) -> Result<O, Error>,
) -> Result<String, wit::PluginError> {
    let to_wit = |e: Error| wit::PluginError {
        message: e.message,
        retryable: e.retryable,
    };
    let input: I = serde_json::from_str(input)
        .map_err(|e| Error::fatal(format!("the input does not fit this plugin: {e}")))
        .map_err(to_wit)?;
    let ctx: Context = ctx.into();
    let output = http::with_run_key(ctx.idempotency_key(), || run(ctx, input)).map_err(to_wit)?;
    serde_json::to_string(&output)
        .map_err(|e| Error::fatal(format!("the output cannot be written as JSON: {e}")))
        .map_err(to_wit)
}

#[doc(hidden)]
pub fn __assert_types<I: DeserializeOwned, O: Serialize>(
    run: fn(Context, I) -> Result<O, Error>,
) -> fn(Context, I) -> Result<O, Error> {
    run
}

/// Exports `run` (a `fn(Context, Input) -> Result<Output, Error>`, where `Input` is
/// `Deserialize` and `Output` is `Serialize`) as the plugin's action.
///
/// - `export_action!(run)`: the plugin declares no input schema; kairos accepts any
///   `input` at booking, and one that does not deserialize fails the run.
/// - `export_action!(run, input_schema)`: `Input` also derives `schemars::JsonSchema`,
///   and its schema (with serde's renames and defaults) is the plugin's input schema:
///   kairos refuses a booking whose `input` does not fit it (400 `invalid_input`).
/// - `export_action!(run, input_schema = TEXT)`: a JSON Schema written by hand.
#[macro_export]
macro_rules! export_action {
    ($run:path) => {
        $crate::export_action!(@export $run, ::core::option::Option::None);
    };
    ($run:path, input_schema) => {
        $crate::export_action!(@export $run, ::core::option::Option::Some($crate::__input_schema($run)));
    };
    ($run:path, input_schema = $schema:expr) => {
        $crate::export_action!(@export $run, ::core::option::Option::Some(::std::string::String::from($schema)));
    };
    (@export $run:path, $schema:expr) => {
        struct __KairosAction;

        impl $crate::bindings::Guest for __KairosAction {
            fn run(
                ctx: $crate::bindings::kairos::plugin0_1_0::types::Context,
                input: ::std::string::String,
            ) -> ::core::result::Result<
                ::std::string::String,
                $crate::bindings::kairos::plugin0_1_0::types::PluginError,
            > {
                $crate::__dispatch(ctx, &input, $crate::__assert_types($run))
            }

            fn input_schema() -> ::core::option::Option<::std::string::String> {
                $schema
            }
        }

        $crate::bindings::export_action_world!(__KairosAction with_types_in $crate::bindings);
    };
}

/// The JSON Schema of `run`'s input type, as text; used by [`export_action!`].
#[doc(hidden)]
pub fn __input_schema<I: DeserializeOwned + schemars::JsonSchema, O: Serialize>(
    _run: fn(Context, I) -> Result<O, Error>,
) -> String {
    serde_json::to_string(&schemars::schema_for!(I)).expect("a schema is JSON")
}
