//! Replays the redis-cli session of `docs/redis-layout.md` against a real redis-server
//! and kairos host: every `$ command` in a `console` block of its "A session to follow"
//! section runs (curl against the host, redis-cli against the test's Redis) and its
//! output must equal the lines the doc shows, where `<now>` stands for any time (epoch
//! ms) within the last minute.

use std::process::Command;

use kairos_e2e::{fast_flags, flags_with, kairos_bin, Host, RedisServer};

/// `text` with every 13-digit number that is a time within the last minute (epoch ms)
/// written `<now>`.
fn now_as_placeholder(text: &str) -> String {
    let now = kairos_e2e::now_ms();
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if run == 0 {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        let digits = &text[i..i + run];
        match digits.parse::<i64>() {
            Ok(ms) if run == 13 && (now - 60_000..=now).contains(&ms) => out.push_str("<now>"),
            _ => out.push_str(digits),
        }
        i += run;
    }
    out
}

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
        let stdout = now_as_placeholder(&String::from_utf8_lossy(&out.stdout));
        let got: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            got, expected,
            "output of `{cmd}` differs from docs/redis-layout.md"
        );
    }
}
