//! WebAssembly action plugins (SPEC section 7).
//!
//! - `registry`: names, versions (and their compile state), limits and component bytes
//!   in Redis; its scripts in `scripts/`;
//! - `input`: input schemas, compiled once per digest, and the check of a booking's input;
//! - `runtime`: the wasmtime engine, compile cache, one fresh sandboxed store per run;
//! - `sandbox`: what a run can touch (logs, follow-up bookings, policed outbound HTTP);
//! - `local`: one run of a component file with no Redis (`kairos plugins run`).
//!
//! Their routes (`PUT|GET|DELETE /plugins/...`) are in `api/plugins.rs`.
//!
//! The contract with plugin authors is the WIT package in `wit/` (world
//! `kairos:plugin/action`, 0.2.0, and 0.1.0 before it); `guest-sdk/` wraps it for
//! Rust, JavaScript and Python.

pub mod input;
pub mod local;
pub mod registry;
pub mod runtime;
pub mod sandbox;

pub use registry::{PluginMeta, Registry};
pub use runtime::{Failure, Invocation, InvokeContext, PluginRuntime, RuntimeSettings};

/// Host bindings generated from the WIT package's world at 0.1.0
/// (`wit/deps/kairos-plugin-0.1`), whose imports 0.2.0 shares: `ActionPre` checks the
/// `run` export both versions have, and the runtime asks for 0.2.0's `input-schema` by
/// name where a component has it. The WASI and wasi-http interfaces are the ones
/// wasmtime-wasi and wasmtime-wasi-http implement.
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "kairos:plugin/action@0.1.0",
        imports: {
            "kairos:plugin/schedule": async,
        },
        exports: { default: async },
        with: {
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        },
    });
}
