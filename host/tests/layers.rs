//! The layers of `host/src/`, checked over its `use` lines and paths: the HTTP layer
//! (`api/`, with `server.rs`, `http_server.rs` and `main.rs` above it) uses the domain
//! (`bookings/`, `timers.rs`, `queues.rs`, `plugins/`, the engine), which uses `store/`,
//! which uses only the shared types below it (`model.rs`, `error.rs`, `config.rs`,
//! `clock.rs`). A module never names one of a layer above its own.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file, by its path under `host/src/`, with its text.
fn files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The lines of `text` outside comments that name one of `banned`.
fn naming(text: &str, banned: &[&str]) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| banned.iter().any(|b| l.contains(b)))
        .map(|l| l.trim().to_string())
        .collect()
}

const HTTP_LAYER: &[&str] = &["api/", "server.rs", "http_server.rs", "main.rs", "lib.rs"];

#[test]
fn only_the_http_layer_knows_http_routes_and_axum() {
    let mut found = Vec::new();
    for (name, text) in files() {
        // The parser fuzz tests drive the API's own parsers, and the CLI is a client.
        if HTTP_LAYER.iter().any(|h| name.starts_with(h)) || name == "parser_fuzz.rs" {
            continue;
        }
        let mut banned = vec!["crate::api", "axum::"];
        if name.starts_with("cli/") {
            banned.retain(|b| *b == "crate::api");
        }
        for line in naming(&text, &banned) {
            found.push(format!("{name}: {line}"));
        }
    }
    assert!(
        found.is_empty(),
        "below the HTTP layer:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_store_knows_nothing_of_the_domain_or_http() {
    let above = [
        "crate::api",
        "crate::bookings",
        "crate::timers",
        "crate::queues",
        "crate::scheduler",
        "crate::executor",
        "crate::supervisor",
        "crate::plugins",
        "crate::server",
        "crate::cli",
        "axum::",
    ];
    let mut found = Vec::new();
    let mut checked = 0;
    for (name, text) in files() {
        if !name.starts_with("store/") {
            continue;
        }
        checked += 1;
        for line in naming(&text, &above) {
            found.push(format!("{name}: {line}"));
        }
    }
    assert!(checked >= 8, "the store's files were not found");
    assert!(
        found.is_empty(),
        "the store names a layer above it:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_shared_types_stand_on_their_own() {
    let above = [
        "crate::api",
        "crate::store",
        "crate::bookings",
        "crate::timers",
        "crate::queues",
        "crate::scheduler",
        "crate::executor",
        "crate::plugins",
        "axum::",
    ];
    let mut found = Vec::new();
    for (name, text) in files() {
        if !["model.rs", "error.rs", "config.rs", "clock.rs"].contains(&name.as_str()) {
            continue;
        }
        for line in naming(&text, &above) {
            found.push(format!("{name}: {line}"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_engine_roles_name_the_engine_and_not_each_other() {
    // scheduler.rs, executor.rs and supervisor.rs each add methods to `engine::Engine`;
    // the state they share lives in `engine/`, so that none of them names another and
    // `engine/` names none of them.
    let roles = ["scheduler", "executor", "supervisor"];
    let mut found = Vec::new();
    let mut checked = 0;
    for (name, text) in files() {
        // A role's own directory (executor/start.rs) is that role.
        let top = name.split('/').next().unwrap_or(&name);
        let own = top.strip_suffix(".rs").unwrap_or(top);
        let banned: Vec<String> = if name.starts_with("engine/") {
            roles.iter().map(|r| format!("crate::{r}")).collect()
        } else if roles.contains(&own) {
            roles
                .iter()
                .filter(|r| **r != own)
                .map(|r| format!("crate::{r}"))
                .collect()
        } else {
            continue;
        };
        checked += 1;
        let banned: Vec<&str> = banned.iter().map(String::as_str).collect();
        for line in naming(&text, &banned) {
            found.push(format!("{name}: {line}"));
        }
    }
    assert!(checked >= 6, "the engine's files were not found");
    assert!(
        found.is_empty(),
        "an import circle among the engine's roles:\n{}",
        found.join("\n")
    );
}
