//! A plugin that misbehaves on request, for the sandbox tests. Not for production.
//!
//! Input `{"mode": ...}`:
//! - `ok`: succeeds with `{"echo": input}` after logging a line and printing to stdout;
//! - `loop`: spins forever (the host's deadline must stop it);
//! - `alloc`: allocates and touches 1 GiB (the memory cap must refuse it);
//! - `panic`: panics (a trap);
//! - `fetch` with `url`: GETs the URL and fails with the error it gets (for a URL the
//!   plugin may not reach, the host's refusal); with `urls` instead, GETs each in turn
//!   and returns their statuses (the first error fails the run);
//! - `retryable`: fails with a retryable error;
//! - `big-error` with `size`: fails with a message of `size` bytes (default 1 MiB);
//! - `flood` with `url` and `n`: starts `n` GETs of the URL at once, then waits for
//!   them all, and returns how many got a response and the distinct errors;
//! - `book-big` with `size`: books a point Life in an hour whose plugin input is a string
//!   of `size` bytes, and returns the booking's error code (or `booked`);
//! - `tcp` with `addr`: connects a TCP socket to `addr` with std (wasi:sockets);
//! - `fs`: reads a file and lists `/` with std (wasi:filesystem), and reads the
//!   environment;
//! - `recurse`: recurses without end (the guest's stack must overflow into a trap);
//! - `fork` with `n`: books `n` Lives a second ahead that run this plugin with the same
//!   input (a fork bomb);
//! - `zero-log` with `size`: logs one line of `size` zero bytes taken from freshly grown
//!   memory, which the guest never touches (so it costs no resident memory unless the
//!   host copies it);
//! - `big-output` with `size`: returns a string of `size` bytes.

use kairos_guest::bindings::wasi::http::outgoing_handler;
use kairos_guest::bindings::wasi::http::types::{Fields, Method, OutgoingRequest, Scheme};
use kairos_guest::{export_action, http, log, schedule, Context, Error};
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
        "fetch" if input["urls"].is_array() => {
            let mut statuses = Vec::new();
            for url in input["urls"].as_array().into_iter().flatten() {
                let response = http::get(url.as_str().unwrap_or_default())?;
                statuses.push(response.status);
            }
            Ok(json!({ "statuses": statuses }))
        }
        "fetch" => {
            let url = input["url"].as_str().unwrap_or("http://127.0.0.1:9/");
            match http::get(url) {
                Ok(r) => Ok(json!({ "status": r.status })),
                Err(e) => Err(e.into()),
            }
        }
        "retryable" => Err(Error::retryable("the hostile plugin asks to be retried")),
        "big-error" => {
            let size = input["size"].as_u64().unwrap_or(1 << 20) as usize;
            Err(Error::fatal("e".repeat(size)))
        }
        "flood" => flood(&input),
        "fork" => {
            let mut booked = 0;
            for _ in 0..input["n"].as_u64().unwrap_or(16) {
                let at = kairos_guest::now_ms() + 1_000;
                let action = json!({"plugin": "hostile", "input": input.clone()});
                if schedule::book_point(at, action).is_ok() {
                    booked += 1;
                }
            }
            Ok(json!({ "booked": booked }))
        }
        "recurse" => Ok(json!({ "depth": recurse(std::hint::black_box(1)) })),
        #[cfg(target_arch = "wasm32")]
        "zero-log" => {
            let size = input["size"].as_u64().unwrap_or(1 << 20) as usize;
            // Fresh pages from memory.grow, behind the allocator's back: WebAssembly
            // memory starts zeroed, and nothing writes these pages.
            let pages = size.div_ceil(65536);
            let first = core::arch::wasm32::memory_grow(0, pages);
            if first == usize::MAX {
                return Err(Error::fatal("memory.grow refused"));
            }
            // SAFETY: the pages were just added to this instance's memory, belong to no
            // allocation, and hold zero bytes, which are valid UTF-8.
            let zeros = unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                    (first * 65536) as *const u8,
                    size,
                ))
            };
            log::info(zeros);
            Ok(json!({ "logged": size }))
        }
        "big-output" => {
            let size = input["size"].as_u64().unwrap_or(1 << 20) as usize;
            Ok(Value::String("o".repeat(size)))
        }
        "book-big" => {
            let size = input["size"].as_u64().unwrap_or(2 << 20) as usize;
            let at = kairos_guest::now_ms() + 3_600_000;
            let action = json!({"plugin": "hostile", "input": "i".repeat(size)});
            match schedule::book_point(at, action) {
                Ok(id) => Ok(json!({ "booked": id })),
                Err(e) => Ok(json!({ "code": e.code })),
            }
        }
        "tcp" => {
            let addr = input["addr"].as_str().unwrap_or("127.0.0.1:9");
            match std::net::TcpStream::connect(addr) {
                Ok(_) => Ok(json!({ "connected": addr })),
                Err(e) => Err(Error::fatal(format!("tcp: {e}"))),
            }
        }
        "fs" => {
            let file = std::fs::read_to_string("/etc/hostname").map_err(|e| e.to_string());
            let root = std::fs::read_dir("/")
                .map(|d| d.count())
                .map_err(|e| e.to_string());
            let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
            Ok(json!({
                "file_ok": file.is_ok(),
                "root_ok": root.is_ok(),
                "env": env,
            }))
        }
        other => Err(Error::fatal(format!("unknown mode `{other}`"))),
    }
}

#[allow(unconditional_recursion)]
fn recurse(n: u64) -> u64 {
    let mut frame = [n; 64];
    frame = std::hint::black_box(frame);
    recurse(frame[3] + 1) + frame[7]
}

/// Starts `n` requests before waiting for any, as a plugin using the raw wasi:http
/// interface can.
fn flood(input: &Value) -> Result<Value, Error> {
    let url = input["url"].as_str().unwrap_or("http://127.0.0.1:9/");
    let n = input["n"].as_u64().unwrap_or(100);
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut pending = Vec::new();
    let mut errors = std::collections::BTreeSet::new();
    for _ in 0..n {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_method(&Method::Get);
        let _ = request.set_scheme(Some(&if scheme == "https" {
            Scheme::Https
        } else {
            Scheme::Http
        }));
        let _ = request.set_authority(Some(authority));
        let _ = request.set_path_with_query(Some(path));
        match outgoing_handler::handle(request, None) {
            Ok(future) => pending.push(future),
            Err(code) => {
                errors.insert(format!("{code:?}"));
            }
        }
    }
    let mut responses = 0;
    for future in pending {
        future.subscribe().block();
        match future.get() {
            Some(Ok(Ok(_response))) => responses += 1,
            Some(Ok(Err(code))) => {
                errors.insert(format!("{code:?}"));
            }
            _ => {
                errors.insert("no response".to_string());
            }
        }
    }
    Ok(json!({ "responses": responses, "errors": errors }))
}

export_action!(run);
