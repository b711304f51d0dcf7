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
    assert_eq!(out.matches("README.md").count(), 1, "{out}");
    let project = parent.0.join("greeter");

    // Its own native tests (the SDK's test kit), then the component.
    let tested = cargo(&project, &["test", "--offline"]);
    assert!(tested.contains("3 passed"), "{tested}");
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

    runs_and_greets(&wasm).await;

    // A second time, over the same directory, it refuses and writes nothing.
    let (code, _, err) = kairos_command(&["plugins", "new", "greeter", "--dir", &dir]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("there already"), "{err}");
}

/// Runs the component at `wasm` once in the host's sandbox (`kairos plugins run`) against
/// a real server, as every template's plugin does: it POSTs the greeting and answers the
/// status.
async fn runs_and_greets(wasm: &std::path::Path) {
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
    // The SDK's default: the key a webhook of the Plan sends (`plugins run` books none:
    // its run is `local-{ms}`, a birth).
    let key = got[0].header("idempotency-key").unwrap_or_default();
    assert!(
        key.starts_with("local-") && key.ends_with(":birth"),
        "{key}"
    );
}

/// Runs `program args` in `dir` with `env`; panics with its output when it fails.
fn run_tool(dir: &std::path::Path, program: &str, args: &[&str], env: &[(&str, String)]) {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes sure scripts/lib.sh's `need` installed its tool (scripts/test does; nothing is
/// installed here), and says where the workspace is.
fn tool_ready(need: &str) -> std::path::PathBuf {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    run_tool(
        &workspace,
        "bash",
        &["-c", &format!(". scripts/lib.sh && {need}")],
        &[("KAIROS_NO_INSTALL", "1".into())],
    );
    workspace.canonicalize().unwrap()
}

/// `--lang js` and `--lang python`: the projects build with their tools as their READMEs
/// say (componentize-js through the project's build script, componentize-py on the
/// project's directory), and the components run in the host's sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_and_python_projects_build_and_run_as_is() {
    let parent = TempDir::new("plugins-new-langs");
    let dir = parent.0.display().to_string();

    let (code, out, err) = kairos_command(&[
        "plugins",
        "new",
        "greeter-js",
        "--lang",
        "js",
        "--dir",
        &dir,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("npm install && npm test && npm run build"),
        "{out}"
    );
    assert_eq!(out.matches("README.md").count(), 1, "{out}");
    let project = parent.0.join("greeter-js");
    let workspace = tool_ready("need_componentize_js");
    // The tools scripts/test installed (those of its package.json), not a download.
    let node_path = workspace.join("target/componentize-js/node_modules");
    // Its own tests, natively with the SDK's test kit, as its README says (`npm test`).
    run_tool(
        &project,
        "node",
        &["--test"],
        &[("NODE_PATH", node_path.display().to_string())],
    );
    // `npm run build`.
    run_tool(
        &project,
        "node",
        &["kairos-guest/build.mjs", "app.js", "greeter_js.wasm", "wit"],
        &[("NODE_PATH", node_path.display().to_string())],
    );
    runs_and_greets(&project.join("greeter_js.wasm")).await;

    let (code, out, err) = kairos_command(&[
        "plugins",
        "new",
        "greeter-py",
        "--lang",
        "python",
        "--dir",
        &dir,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // Said once, with the test kit's jsonschema in the venv it makes.
    assert_eq!(out.matches("README.md").count(), 1, "{out}");
    assert!(
        out.contains("jsonschema") && out.contains(".venv/bin/python -m unittest"),
        "{out}"
    );
    let project = parent.0.join("greeter-py");
    let workspace = tool_ready("need_componentize_py");
    // Its own tests, natively with the SDK's test kit, as its README says, in the venv
    // scripts/test made as the README makes .venv (componentize-py and jsonschema).
    let python = workspace.join("target/componentize-py-venv/bin/python");
    run_tool(
        &project,
        &python.display().to_string(),
        &["-m", "unittest", "-q"],
        &[],
    );
    let componentize = workspace.join("target/componentize-py-venv/bin/componentize-py");
    run_tool(
        &project,
        &componentize.display().to_string(),
        &[
            "-q",
            "-d",
            "wit",
            "-w",
            "kairos:plugin/action@0.2.0",
            "componentize",
            "-p",
            ".",
            "app",
            "-o",
            "greeter_py.wasm",
        ],
        &[],
    );
    runs_and_greets(&project.join("greeter_py.wasm")).await;
}

/// The code blocks of a Markdown file in `lang` (```lang ... ```), in order.
fn code_blocks(markdown: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    markdown
        .split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap().to_string())
        .collect()
}

/// The JavaScript and Python SDKs' READMEs start from `kairos plugins new`, and their
/// plugin (section 2) and its tests (section 3) work when pasted into such a project as
/// they are: the tests pass, natively with the SDK's test kit (which refuses an input
/// that does not fit the plugin's schema in the host's words).
#[test]
fn the_readmes_plugin_and_tests_work_pasted_into_a_new_project() {
    let parent = TempDir::new("plugins-new-readme");
    let dir = parent.0.display().to_string();
    let workspace = tool_ready("need_componentize_js && need_componentize_py");
    for (lang, readme, code, files) in [
        (
            "js",
            "guest-sdk/js/README.md",
            "js",
            ["app.js", "app.test.mjs"],
        ),
        (
            "python",
            "guest-sdk/python/README.md",
            "python",
            ["app.py", "test_app.py"],
        ),
    ] {
        let readme = std::fs::read_to_string(workspace.join(readme)).unwrap();
        let first_step = format!("kairos plugins new uptime-check --lang {lang}");
        let start = readme.find("## 1.").expect("a section 1");
        assert!(
            readme[start..]
                .starts_with(&format!("## 1. Start: `kairos plugins new --lang {lang}`"))
                && readme[start..].find(&first_step) < readme[start..].find("## 2."),
            "{lang}: section 1 starts with {first_step}"
        );
        assert!(
            !readme.contains("mkdir"),
            "{lang}: the README still starts from mkdir"
        );
        let blocks = code_blocks(&readme, code);
        assert!(blocks.len() >= 2, "{lang}: {blocks:?}");
        let (code, out, err) = kairos_command(&[
            "plugins",
            "new",
            "uptime-check",
            "--lang",
            lang,
            "--dir",
            &dir,
        ]);
        assert_eq!(code, 0, "{out}{err}");
        let project = parent.0.join("uptime-check");
        for (file, text) in files.iter().zip(&blocks) {
            std::fs::write(project.join(file), text).unwrap();
        }
        let node_path = workspace.join("target/componentize-js/node_modules");
        let python = workspace.join("target/componentize-py-venv/bin/python");
        if lang == "js" {
            let tests = code_blocks(&readme, "js")[1].matches("test(").count();
            assert!(tests >= 3, "{tests}");
            run_tool(
                &project,
                "node",
                &["--test"],
                &[("NODE_PATH", node_path.display().to_string())],
            );
        } else {
            run_tool(
                &project,
                &python.display().to_string(),
                &["-m", "unittest", "-q"],
                &[],
            );
        }
        std::fs::remove_dir_all(&project).unwrap();
    }
}

/// `kairos plugins new --help` says it writes a project in any of the three languages.
#[test]
fn plugins_new_help_names_the_three_languages() {
    let (code, out, err) = kairos_command(&["plugins", "new", "--help"]);
    assert_eq!(code, 0, "{err}");
    for word in ["JavaScript", "Python", "Rust", "tests"] {
        assert!(out.contains(word), "{word}: {out}");
    }
    assert!(!out.contains("a Rust crate with"), "{out}");
}
