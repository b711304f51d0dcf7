//! `kairos plugins new NAME [--lang rust|js|python]`: writes a plugin project that builds
//! as is. The guest SDK of its language and the WIT files it is built against are
//! compiled into this binary and copied into the project, so that it needs no kairos
//! checkout and matches this host's interface exactly.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// A file of the project: its path under the project's directory and its text.
type File = (&'static str, &'static str);

/// The WIT package, as this kairos was built with it.
const WIT: &[File] = &[
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
    (
        "wit/deps/kairos-plugin-0.1/plugin.wit",
        include_str!("../../../wit/deps/kairos-plugin-0.1/plugin.wit"),
    ),
    (
        "wit/deps/cli/cli.wit",
        include_str!("../../../wit/deps/cli/cli.wit"),
    ),
    (
        "wit/deps/clocks/clocks.wit",
        include_str!("../../../wit/deps/clocks/clocks.wit"),
    ),
    (
        "wit/deps/filesystem/filesystem.wit",
        include_str!("../../../wit/deps/filesystem/filesystem.wit"),
    ),
    (
        "wit/deps/http/http.wit",
        include_str!("../../../wit/deps/http/http.wit"),
    ),
    (
        "wit/deps/io/io.wit",
        include_str!("../../../wit/deps/io/io.wit"),
    ),
    (
        "wit/deps/random/random.wit",
        include_str!("../../../wit/deps/random/random.wit"),
    ),
    (
        "wit/deps/sockets/sockets.wit",
        include_str!("../../../wit/deps/sockets/sockets.wit"),
    ),
];

/// The Rust guest SDK (its crate finds the WIT package at ../wit).
const SDK_RUST: &[File] = &[
    (
        "kairos-guest/Cargo.toml",
        include_str!("../../../guest-sdk/Cargo.toml"),
    ),
    (
        "kairos-guest/src/lib.rs",
        include_str!("../../../guest-sdk/src/lib.rs"),
    ),
    (
        "kairos-guest/src/http.rs",
        include_str!("../../../guest-sdk/src/http.rs"),
    ),
    (
        "kairos-guest/src/log.rs",
        include_str!("../../../guest-sdk/src/log.rs"),
    ),
    (
        "kairos-guest/src/schedule.rs",
        include_str!("../../../guest-sdk/src/schedule.rs"),
    ),
    (
        "kairos-guest/src/testing.rs",
        include_str!("../../../guest-sdk/src/testing.rs"),
    ),
    // The lock file of kairos's own plugins: the new project starts from the dependency
    // versions they are tested with (cargo drops what it does not use and adds the
    // project).
    ("Cargo.lock", include_str!("../../../plugins/Cargo.lock")),
];

/// The JavaScript guest SDK and its build script.
const SDK_JS: &[File] = &[
    (
        "kairos-guest/kairos.js",
        include_str!("../../../guest-sdk/js/kairos.js"),
    ),
    (
        "kairos-guest/build.mjs",
        include_str!("../../../guest-sdk/js/build.mjs"),
    ),
    (
        "kairos-guest/testing.mjs",
        include_str!("../../../guest-sdk/js/testing.mjs"),
    ),
    (
        "kairos-guest/native/hooks.mjs",
        include_str!("../../../guest-sdk/js/native/hooks.mjs"),
    ),
    (
        "kairos-guest/native/wit.mjs",
        include_str!("../../../guest-sdk/js/native/wit.mjs"),
    ),
    (
        "kairos-guest/native/wasi.mjs",
        include_str!("../../../guest-sdk/js/native/wasi.mjs"),
    ),
];

/// The Python guest SDK (a package next to the plugin's module).
const SDK_PYTHON: &[File] = &[
    (
        "kairos_guest/__init__.py",
        include_str!("../../../guest-sdk/python/kairos_guest/__init__.py"),
    ),
    (
        "kairos_guest/http.py",
        include_str!("../../../guest-sdk/python/kairos_guest/http.py"),
    ),
    (
        "kairos_guest/log.py",
        include_str!("../../../guest-sdk/python/kairos_guest/log.py"),
    ),
    (
        "kairos_guest/schedule.py",
        include_str!("../../../guest-sdk/python/kairos_guest/schedule.py"),
    ),
    (
        "kairos_guest/testing.py",
        include_str!("../../../guest-sdk/python/kairos_guest/testing.py"),
    ),
    (
        "kairos_guest/_native.py",
        include_str!("../../../guest-sdk/python/kairos_guest/_native.py"),
    ),
];

/// Each language's own project files, with `{{name}}` and `{{crate}}` to fill in.
const TEMPLATE_RUST: &[File] = &[
    ("Cargo.toml", include_str!("template/Cargo.toml.tmpl")),
    ("src/lib.rs", include_str!("template/lib.rs.tmpl")),
    ("README.md", include_str!("template/README.md.tmpl")),
    (".gitignore", "/target\n"),
];
const TEMPLATE_JS: &[File] = &[
    ("app.js", include_str!("template/app.js.tmpl")),
    ("app.test.mjs", include_str!("template/app.test.mjs.tmpl")),
    ("package.json", include_str!("template/package.json.tmpl")),
    ("README.md", include_str!("template/README.js.md.tmpl")),
    (".gitignore", "/node_modules\n*.wasm\n"),
];
const TEMPLATE_PYTHON: &[File] = &[
    ("app.py", include_str!("template/app.py.tmpl")),
    ("test_app.py", include_str!("template/test_app.py.tmpl")),
    ("README.md", include_str!("template/README.py.md.tmpl")),
    (".gitignore", "/.venv\n__pycache__/\n*.wasm\n"),
];

/// What to run in a new project of `lang` first: install its tools, run its tests, build.
pub fn next_steps(lang: &str) -> &'static str {
    match lang {
        "rust" => "cargo test && cargo build --release --target wasm32-wasip2",
        "python" => "python3 -m venv .venv && .venv/bin/pip install componentize-py==0.25.1 jsonschema==4.26.0 && .venv/bin/python -m unittest",
        _ => "npm install && npm test && npm run build",
    }
}

/// Whether `name` can name a plugin and its crate: 1 to 64 of `a-z`, `0-9`, `-`,
/// starting with a letter (a plugin name in the registry, and a valid package name).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Writes the project `name` under `parent` (as `parent/name`), refusing a directory
/// that is there already. Returns the project's directory.
pub fn write_project(name: &str, parent: &Path, lang: &str) -> anyhow::Result<PathBuf> {
    let (sdk, template) = match lang {
        "rust" => (SDK_RUST, TEMPLATE_RUST),
        "js" | "javascript" => (SDK_JS, TEMPLATE_JS),
        "python" => (SDK_PYTHON, TEMPLATE_PYTHON),
        other => bail!("--lang {other}: choose rust, js or python"),
    };
    if !valid_name(name) {
        bail!(
            "`{name}` cannot name a plugin: use 1 to 64 of a-z, 0-9 and -, starting with a letter"
        );
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{} is there already; choose another name or directory",
            dir.display()
        );
    }
    let crate_name = name.replace('-', "_");
    for (path, text) in WIT.iter().chain(sdk) {
        write(&dir, path, text)?;
    }
    for (path, text) in template {
        let text = text
            .replace("{{name}}", name)
            .replace("{{crate}}", &crate_name);
        write(&dir, path, &text)?;
    }
    Ok(dir)
}

fn write(dir: &Path, path: &str, text: &str) -> anyhow::Result<()> {
    let path = dir.join(path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_those_of_plugins_and_crates() {
        for good in ["hello", "uptime-check", "a1"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Hello", "1st", "-x", "a_b", "a b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_project_has_the_sdk_the_wit_files_and_its_name() {
        let parent = std::env::temp_dir().join(format!("kairos-new-{}", std::process::id()));
        let dir = write_project("uptime-check", &parent, "rust").unwrap();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"uptime-check\""), "{manifest}");
        assert!(!manifest.contains("{{"), "{manifest}");
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("release/uptime_check.wasm"), "{readme}");
        // The SDK finds the WIT package at ../wit, as in the kairos repository.
        let sdk = std::fs::read_to_string(dir.join("kairos-guest/src/lib.rs")).unwrap();
        assert!(sdk.contains("path: \"../wit\""));
        assert!(dir.join("wit/deps/http/http.wit").is_file());
        // A second time it refuses to write over it.
        let again = write_project("uptime-check", &parent, "rust").unwrap_err();
        assert!(again.to_string().contains("there already"), "{again}");
        assert!(write_project("x", &parent, "cobol").is_err());
        // JavaScript and Python: the plugin, its SDK and the same WIT package.
        let js = write_project("greeter-js", &parent, "js").unwrap();
        let package = std::fs::read_to_string(js.join("package.json")).unwrap();
        assert!(package.contains("greeter_js.wasm"), "{package}");
        assert!(js.join("kairos-guest/kairos.js").is_file());
        assert!(js.join("wit/plugin.wit").is_file());
        let py = write_project("greeter-py", &parent, "python").unwrap();
        assert!(py.join("kairos_guest/__init__.py").is_file());
        let app = std::fs::read_to_string(py.join("app.py")).unwrap();
        assert!(app.contains("`greeter-py`") && !app.contains("{{"), "{app}");
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
