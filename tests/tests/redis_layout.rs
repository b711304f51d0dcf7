//! Replays the redis-cli session of `docs/redis-layout.md` against a real redis-server
//! and kairos host: every `$ command` in a `console` block of its "A session to follow"
//! section runs (curl against the host, redis-cli against the test's Redis) and its
//! output must equal the lines the doc shows.

use std::process::Command;

use kairos_e2e::{fast_flags, flags_with, kairos_bin, Host, RedisServer};

/// (command, expected output lines) in document order.
fn session(doc: &str) -> Vec<(String, Vec<String>)> {
    let section = doc
        .split("## A session to follow")
        .nth(1)
        .expect("the doc has the session section");
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_block = false;
    for line in section.lines() {
        if line.starts_with("```") {
            in_block = line.trim() == "```console";
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            steps.push((cmd.to_string(), Vec::new()));
        } else if let Some(step) = steps.last_mut() {
            step.1.push(line.to_string());
        }
    }
    steps
}

#[test]
fn the_documented_session_is_what_redis_shows() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/redis-layout.md"
    ))
    .unwrap();
    let steps = session(&doc);
    assert!(
        steps.len() >= 10,
        "the session should have its commands, found {}",
        steps.len()
    );
    assert!(steps.iter().any(|(c, _)| c.starts_with("curl")));

    let redis = RedisServer::start();
    let host = Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[
                ("--gateway-url", "http://gateway.example:8000"),
                ("--timezone", "UTC"),
            ],
        ),
    );
    for (cmd, expected) in steps {
        // The session reads the managed Redis through its socket; here, the test's own.
        let real = if let Some(args) = cmd.strip_prefix("redis-cli -s .kairos-data/redis.sock ") {
            format!("redis-cli -p {} --no-raw {args}", redis.port)
        } else if let Some(args) = cmd.strip_prefix("kairos ") {
            format!("{} {args}", kairos_bin().display())
        } else {
            cmd.replace("localhost:8080", &host.addr.to_string())
        };
        let out = Command::new("bash").arg("-c").arg(&real).output().unwrap();
        assert!(
            out.status.success(),
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let got: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            got, expected,
            "output of `{cmd}` differs from docs/redis-layout.md"
        );
    }
}
