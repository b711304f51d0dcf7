//! WebAssembly action plugins (SPEC section 7).
//!
//! - `registry`: names, versions, limits and component bytes in Redis;
//! - `runtime`: the wasmtime engine, compile cache, one fresh sandboxed store per run;
//! - `sandbox`: what a run can touch (logs, follow-up bookings, policed outbound HTTP);
//! - `local`: one run of a component file with no Redis (`kairos plugins run`).
//!
//! Their routes (`PUT|GET|DELETE /plugins/...`) are in `api/plugins.rs`.
//!
//! The contract with plugin authors is the WIT package in `wit/` (world
//! `kairos:plugin/action`); `guest-sdk/` wraps it for Rust.

pub mod local;
pub mod registry;
pub mod runtime;
pub mod sandbox;

pub use registry::{PluginMeta, Registry};
pub use runtime::{Failure, Invocation, InvokeContext, PluginRuntime, RuntimeSettings};

/// Host bindings generated from `wit/plugin.wit`. The WASI and wasi-http interfaces
/// are the ones wasmtime-wasi and wasmtime-wasi-http implement.
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "kairos:plugin/action",
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
