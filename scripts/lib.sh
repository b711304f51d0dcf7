# Shared by scripts/serve and scripts/test: make sure the tools kairos needs are here,
# installing them where this machine allows, or saying exactly what is missing.

need_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: install Rust with rustup (https://rustup.rs), then run this again." >&2
    exit 1
  fi
}

# redis-server and redis-cli (Debian/Ubuntu package redis-server, which brings redis-tools).
need_redis() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return
  fi
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing redis-server (apt-get)…" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then
    echo "installing redis-server (sudo apt-get)…" >&2
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is missing: install it (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis), or run with --redis-url." >&2
    exit 1
  fi
}

need_curl() {
  command -v curl >/dev/null 2>&1 && return
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
  fi
  command -v curl >/dev/null 2>&1 || { echo "curl is missing: apt-get install -y curl" >&2; exit 1; }
}

# Headless Chromium and its WebDriver, for the dashboard's browser test
# (tests/tests/dashboard.rs): Debian's chromium and chromium-driver packages.
need_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return
  fi
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing chromium and chromium-driver (apt-get)…" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver (sudo apt-get)…" >&2
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "chromium and chromedriver are missing: install them (Debian/Ubuntu: apt-get install -y chromium chromium-driver); the dashboard test fails without them." >&2
    exit 1
  fi
}

# promtool, for the test that lints the /metrics exposition (tests/tests/metrics.rs):
# Debian's prometheus package ships /usr/bin/promtool. Installed without starting the
# Prometheus server: where the package's postinst would start one (a machine with
# systemd or init scripts and no policy-rc.d saying no), a policy-rc.d that refuses
# every start is put in place for the install and removed after it.
need_promtool() {
  command -v promtool >/dev/null 2>&1 && return
  install="apt-get install -y --no-install-recommends prometheus"
  sudo=""
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo="sudo"; }
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; then
    echo "installing promtool ($install)…" >&2
    guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      guard=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' | $sudo tee "$guard" >/dev/null && $sudo chmod +x "$guard"
    fi
    $sudo apt-get update -qq >/dev/null && $sudo env DEBIAN_FRONTEND=noninteractive $install -qq >/dev/null
    [ -n "$guard" ] && $sudo rm -f "$guard"
    # Nor started at the next boot: only its promtool is wanted.
    if command -v systemctl >/dev/null 2>&1; then
      $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  fi
  command -v promtool >/dev/null 2>&1 || {
    echo "promtool is missing: $install; the /metrics lint test fails without it." >&2
    exit 1
  }
}

# The wasm32-wasip2 standard library, for building plugins.
need_wasm_target() {
  if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    return
  fi
  if command -v rustup >/dev/null 2>&1; then
    echo "installing the wasm32-wasip2 target (rustup)…" >&2
    rustup target add wasm32-wasip2 >&2 || true
  fi
  rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || {
    echo "the wasm32-wasip2 Rust target is missing: rustup target add wasm32-wasip2" >&2
    exit 1
  }
}

# Builds plugins/ (examples, built-ins and test plugins) as components into
# target-plugins/wasm32-wasip2/release/, apart from the host's target/.
build_plugins() {
  need_wasm_target
  cargo build -j2 --release --target wasm32-wasip2 \
    --manifest-path plugins/Cargo.toml --target-dir target-plugins
}

# A Python virtual environment for the test tools from PyPI (the cron oracle, the API
# fuzzer), in target/test-venv. Needs python3 with its venv module (Debian: python3-venv).
need_test_venv() {
  venv=target/test-venv
  if [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: apt-get install -y python3 python3-venv" >&2; exit 1; }
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      fi
      rm -rf "$venv"
      python3 -m venv "$venv" || { echo "python3 cannot make a virtual environment: apt-get install -y python3-venv" >&2; exit 1; }
    fi
  fi
  # Pinned: the oracle's answers, and the fuzzer's cases, must not move under the test.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check cronsim==2.8 croniter==7.0.0 schemathesis==4.32.5 || {
    echo "cannot install cronsim, croniter and schemathesis from PyPI into $venv" >&2; exit 1; }
  TEST_PYTHON="$venv/bin/python"
}

# componentize-py from PyPI, pinned (its CLI and the Python modules it generates for a
# WIT world change between releases), with jsonschema, which the SDK's test kit
# (kairos_guest.testing) checks inputs against a plugin's input schema with, in a
# virtual environment of its own, target/componentize-py-venv, kept between runs (a
# component bundles only what its modules import: jsonschema is not in it). Sets
# COMPONENTIZE_PY, and KIT_PYTHON for the plugins' own tests. With KAIROS_NO_INSTALL=1
# (the end-to-end tests) it installs nothing and says what to run.
COMPONENTIZE_PY_VERSION=0.25.1
JSONSCHEMA_PY_VERSION=4.26.0
need_componentize_py() {
  venv=target/componentize-py-venv
  COMPONENTIZE_PY="$venv/bin/componentize-py"
  KIT_PYTHON="$PWD/$venv/bin/python"
  if "$COMPONENTIZE_PY" --version 2>/dev/null | grep -qx "componentize-py $COMPONENTIZE_PY_VERSION" &&
    "$KIT_PYTHON" -m pip show jsonschema 2>/dev/null | grep -qx "Version: $JSONSCHEMA_PY_VERSION"; then
    return
  fi
  install="python3 -m venv $venv && $venv/bin/python -m pip install componentize-py==$COMPONENTIZE_PY_VERSION jsonschema==$JSONSCHEMA_PY_VERSION"
  if [ "${KAIROS_NO_INSTALL:-}" = 1 ]; then
    echo "componentize-py $COMPONENTIZE_PY_VERSION is missing: $install (scripts/test does this)" >&2
    return 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: apt-get install -y python3 python3-venv" >&2; return 1; }
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      fi
      rm -rf "$venv"
      python3 -m venv "$venv" || { echo "python3 cannot make a virtual environment: apt-get install -y python3-venv" >&2; return 1; }
    fi
  fi
  echo "installing componentize-py $COMPONENTIZE_PY_VERSION and jsonschema $JSONSCHEMA_PY_VERSION (pip)…" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "componentize-py==$COMPONENTIZE_PY_VERSION" "jsonschema==$JSONSCHEMA_PY_VERSION" || {
    echo "cannot install componentize-py and jsonschema from PyPI: $install" >&2; return 1; }
}

# Whether the component $1 is up to date: it and its stamp $2 (the tool's pinned
# version) exist, and no file under the other arguments is newer than it.
component_fresh() {
  local out=$1 stamp=$2
  shift 2
  [ -f "$out" ] && [ -f "$stamp" ] && [ -z "$(find "$@" -type f -newer "$out" -print -quit)" ]
}

# Builds each Python plugin, plugins/python-*/ (its module app.py, with the SDK in
# guest-sdk/python), into target-plugins/python/{name with _}.wasm against wit/; a
# component newer than its sources, the SDK, wit/ and the pinned version is kept.
build_python_plugins() {
  need_componentize_py || return 1
  mkdir -p target-plugins/python
  for dir in plugins/python-*/; do
    name=$(basename "$dir")
    out="target-plugins/python/${name//-/_}.wasm"
    stamp="$out.componentize-py-$COMPONENTIZE_PY_VERSION"
    component_fresh "$out" "$stamp" "$dir" guest-sdk/python/kairos_guest wit && continue
    echo "building $out (componentize-py)…" >&2
    rm -f "$out".componentize-py-*
    "$COMPONENTIZE_PY" -q -d wit -w kairos:plugin/action@0.2.0 componentize \
      -p "$dir" -p guest-sdk/python app -o "$out.tmp" >&2 || { rm -f "$out.tmp"; return 1; }
    mv "$out.tmp" "$out" && touch "$stamp"
  done
}

# componentize-js and rolldown from the npm registry, pinned (the component's runtime,
# StarlingMonkey, comes with componentize-js), with ajv and ajv-formats, which the SDK's
# test kit (guest-sdk/js/testing.mjs) checks inputs against a plugin's input schema
# with, into target/componentize-js, kept between runs; Node.js 18 or newer from
# Debian's nodejs and npm packages where missing. Sets JS_NODE_PATH (the kit finds ajv
# through NODE_PATH). With KAIROS_NO_INSTALL=1 (the end-to-end tests) it installs nothing
# and says what to run.
COMPONENTIZE_JS_VERSION=0.23.0
ROLLDOWN_VERSION=1.3.2
AJV_VERSION=8.20.0
AJV_FORMATS_VERSION=3.0.1
need_componentize_js() {
  dir=target/componentize-js
  JS_NODE_PATH="$PWD/$dir/node_modules"
  manifest="$dir/node_modules/@bytecodealliance/componentize-js/package.json"
  if [ -f "$manifest" ] && grep -q "\"version\": \"$COMPONENTIZE_JS_VERSION\"" "$manifest" &&
    [ -f "$dir/node_modules/rolldown/package.json" ] &&
    grep -q "\"version\": \"$AJV_VERSION\"" "$dir/node_modules/ajv/package.json" 2>/dev/null &&
    grep -q "\"version\": \"$AJV_FORMATS_VERSION\"" "$dir/node_modules/ajv-formats/package.json" 2>/dev/null; then
    return
  fi
  install="npm install --prefix $dir @bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION rolldown@$ROLLDOWN_VERSION ajv@$AJV_VERSION ajv-formats@$AJV_FORMATS_VERSION"
  if [ "${KAIROS_NO_INSTALL:-}" = 1 ]; then
    echo "componentize-js $COMPONENTIZE_JS_VERSION is missing: $install (scripts/test does this)" >&2
    return 1
  fi
  if ! command -v npm >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "installing Node.js and npm (apt-get)…" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
    command -v npm >/dev/null 2>&1 || { echo "Node.js and npm are missing: apt-get install -y nodejs npm" >&2; return 1; }
  fi
  echo "installing componentize-js $COMPONENTIZE_JS_VERSION, rolldown $ROLLDOWN_VERSION and ajv $AJV_VERSION (npm)…" >&2
  # Afresh: componentize-js imports @bytecodealliance/preview2-shim without depending on
  # it, and an install over an older tree can leave that package nested out of its reach.
  rm -rf "$dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --silent \
    "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION" "rolldown@$ROLLDOWN_VERSION" \
    "ajv@$AJV_VERSION" "ajv-formats@$AJV_FORMATS_VERSION" >&2 || {
    echo "cannot install componentize-js, rolldown and ajv from the npm registry: $install" >&2; return 1; }
}

# Builds each JavaScript plugin, plugins/js-*/ (its module app.js, with the SDK in
# guest-sdk/js), into target-plugins/js/{name with _}.wasm against wit/; a component
# newer than its sources, the SDK, wit/ and the pinned versions is kept.
build_js_plugins() {
  need_componentize_js || return 1
  mkdir -p target-plugins/js
  for dir in plugins/js-*/; do
    name=$(basename "$dir")
    out="target-plugins/js/${name//-/_}.wasm"
    stamp="$out.componentize-js-$COMPONENTIZE_JS_VERSION"
    component_fresh "$out" "$stamp" "$dir" guest-sdk/js wit && continue
    echo "building $out (componentize-js)…" >&2
    rm -f "$out".componentize-js-*
    NODE_PATH="$JS_NODE_PATH" node guest-sdk/js/build.mjs "$dir/app.js" "$out.tmp" wit >&2 ||
      { rm -f "$out.tmp"; return 1; }
    mv "$out.tmp" "$out" && touch "$stamp"
  done
}

# The client generators scripts/generated_clients.py drives, pinned (what they generate
# changes between releases): openapi-python-client and mypy from PyPI in
# target/clients-venv (sets CLIENTS_PYTHON); openapi-typescript, openapi-fetch,
# TypeScript and Node's types from npm in target/clients-npm (sets CLIENTS_NPM). Kept
# between runs.
OPENAPI_PYTHON_CLIENT_VERSION=0.29.1
MYPY_VERSION=2.4.1
OPENAPI_TYPESCRIPT_VERSION=7.13.0
OPENAPI_FETCH_VERSION=0.17.0
TYPESCRIPT_VERSION=5.9.3
TYPES_NODE_VERSION=20.19.25
need_client_generators() {
  venv=target/clients-venv
  CLIENTS_PYTHON="$venv/bin/python"
  if [ ! -x "$venv/bin/openapi-python-client" ] ||
    ! "$CLIENTS_PYTHON" -m pip show openapi-python-client 2>/dev/null | grep -qx "Version: $OPENAPI_PYTHON_CLIENT_VERSION" ||
    ! "$CLIENTS_PYTHON" -m pip show mypy 2>/dev/null | grep -qx "Version: $MYPY_VERSION"; then
    command -v python3 >/dev/null 2>&1 || { echo "python3 is missing: apt-get install -y python3 python3-venv" >&2; return 1; }
    rm -rf "$venv"
    python3 -m venv "$venv" || { echo "python3 cannot make a virtual environment: apt-get install -y python3-venv" >&2; return 1; }
    echo "installing openapi-python-client $OPENAPI_PYTHON_CLIENT_VERSION and mypy $MYPY_VERSION (pip)…" >&2
    "$CLIENTS_PYTHON" -m pip install -q --disable-pip-version-check \
      "openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION" "mypy==$MYPY_VERSION" >&2 || {
      echo "cannot install openapi-python-client and mypy from PyPI into $venv" >&2; return 1; }
  fi
  CLIENTS_NPM=target/clients-npm
  wanted="openapi-typescript@$OPENAPI_TYPESCRIPT_VERSION openapi-fetch@$OPENAPI_FETCH_VERSION typescript@$TYPESCRIPT_VERSION @types/node@$TYPES_NODE_VERSION"
  for package in $wanted; do
    name=${package%@*}
    grep -q "\"version\": \"${package##*@}\"" "$CLIENTS_NPM/node_modules/$name/package.json" 2>/dev/null && continue
    command -v npm >/dev/null 2>&1 || { echo "Node.js and npm are missing: apt-get install -y nodejs npm" >&2; return 1; }
    echo "installing $wanted (npm)…" >&2
    rm -rf "$CLIENTS_NPM" && mkdir -p "$CLIENTS_NPM"
    # shellcheck disable=SC2086
    npm install --prefix "$CLIENTS_NPM" --no-audit --no-fund --silent $wanted >&2 || {
      echo "cannot install $wanted from the npm registry" >&2; return 1; }
    break
  done
}
