//! A plugin that misbehaves on request, for the sandbox tests. Not for production.
//!
//! Input `{"mode": ...}`:
//! - `ok`: succeeds with `{"echo": input}` after logging a line and printing to stdout;
//! - `loop`: spins forever (the host's deadline must stop it);
//! - `alloc`: allocates and touches 1 GiB (the memory cap must refuse it);
//! - `panic`: panics (a trap);
//! - `fetch` with `url`: GETs the URL and fails with the error it gets (for a URL the
//!   plugin may not reach, the host's refusal);
//! - `retryable`: fails with a retryable error.

use kairos_guest::{export_action, http, log, Context, Error};
use serde_json::{json, Value};

fn run(_ctx: Context, input: Value) -> Result<Value, Error> {
    match input["mode"].as_str().unwrap_or("ok") {
        "ok" => {
            log::info("hostile plugin in ok mode");
            println!("printed to stdout");
            Ok(json!({ "echo": input }))
        }
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "alloc" => {
            let mut v: Vec<u8> = Vec::new();
            v.resize(1 << 30, 1);
            Ok(json!({ "allocated": v.len() }))
        }
        "panic" => panic!("the hostile plugin panics on purpose"),
        "fetch" => {
            let url = input["url"].as_str().unwrap_or("http://127.0.0.1:9/");
            match http::get(url) {
                Ok(r) => Ok(json!({ "status": r.status })),
                Err(e) => Err(e.into()),
            }
        }
        "retryable" => Err(Error::retryable("the hostile plugin asks to be retried")),
        other => Err(Error::fatal(format!("unknown mode `{other}`"))),
    }
}

export_action!(run);
