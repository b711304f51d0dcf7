//! `kairos plugins new NAME`: the project it writes builds as is, its own tests pass
//! natively, and the component it builds runs in the host's sandbox and reaches a real
//! HTTP server.

use std::process::Command;
use std::time::Duration;

use kairos_e2e::*;

/// Runs `cargo ARGS` in `dir`, with the plugins' target directory so that the
/// dependencies they share are built once; panics with cargo's output when it fails.
fn cargo(dir: &std::path::Path, args: &[&str]) -> String {
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target-plugins");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .args(["-j2", "--target-dir"])
        .arg(&target)
        .current_dir(dir)
        .output()
        .expect("cargo runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "cargo {args:?} in {}: {text}",
        dir.display()
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_project_builds_tests_and_runs_as_is() {
    let parent = TempDir::new("plugins-new");
    let dir = parent.0.display().to_string();
    let (code, out, err) = kairos_command(&["plugins", "new", "greeter", "--dir", &dir]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("greeter"), "{out}");
    let project = parent.0.join("greeter");

    // Its own native tests (the SDK's test kit), then the component.
    let tested = cargo(&project, &["test", "--offline"]);
    assert!(tested.contains("2 passed"), "{tested}");
    cargo(
        &project,
        &[
            "build",
            "--offline",
            "--release",
            "--target",
            "wasm32-wasip2",
        ],
    );
    let wasm = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target-plugins/wasm32-wasip2/release/greeter.wasm");
    assert!(wasm.is_file(), "{}", wasm.display());

    // Run once in the host's sandbox, against a real server.
    let sink = Sink::start().await;
    let target = format!("127.0.0.1:{}", sink.addr.port());
    let input = serde_json::json!({"url": format!("http://{target}/hi"), "name": "kairos"});
    let (wasm, input) = (wasm.display().to_string(), input.to_string());
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        kairos_command(&[
            "-o", "json", "plugins", "run", &wasm, "--input", &input, "--allow", &target,
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let run: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(run["output"], r#"{"status":200}"#, "{run}");
    let got = sink.wait_count(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].path, "/hi");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[0].body).unwrap(),
        serde_json::json!({"greeting": "hello, kairos"})
    );

    // A second time, over the same directory, it refuses and writes nothing.
    let (code, _, err) = kairos_command(&["plugins", "new", "greeter", "--dir", &dir]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("there already"), "{err}");
}
