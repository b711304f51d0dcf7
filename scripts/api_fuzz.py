#!/usr/bin/env python3
"""Fuzzes every route of kairos's REST API from its own OpenAPI document.

Starts a redis-server and a `kairos serve` of its own on free loopback ports (an API
token of each scope, a gateway URL so that webhook actions with a `path` are accepted),
then runs schemathesis (PyPI) against `GET /openapi.json` for a bounded time: examples,
the coverage phase (boundary and invalid values of every parameter and body), random
fuzzing and stateful sequences (create, read, change, delete through the document's
links). It fails on:

- any 5xx answer (`not_a_server_error`);
- an answer whose status the document does not list for the route
  (`status_code_conformance`), whose content type it does not list
  (`content_type_conformance`), or whose body does not fit the route's schema
  (`response_schema_conformance`);
- a host that logged a panic or died under the fuzzing.

Before it fuzzes, it checks what the fuzzer cannot: that the document is OpenAPI 3.1,
served without a token.

Usage: api_fuzz.py --kairos PATH [--max-time SECONDS] [--seed N]
"""

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    ]
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, ready, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    raise SystemExit(f"api_fuzz: {what} did not happen within {within} s")


def start_redis(workdir):
    """A redis-server of its own; another port when a neighbour took the one picked."""
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers():
            if proc.poll() is not None:
                return True
            try:
                out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "server"],
                                     capture_output=True, text=True, timeout=2).stdout
            except subprocess.TimeoutExpired:
                return False
            return f"process_id:{proc.pid}" in out

        wait_until("redis-server start", answers, 10)
        if proc.poll() is None:
            return proc, port
    raise SystemExit("api_fuzz: redis-server did not start on any of 5 free ports")


def start_kairos(kairos, redis_port, tokens, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [kairos, "serve", "--redis-url", f"redis://127.0.0.1:{redis_port}",
         "--listen", "127.0.0.1:0",
         "--api-tokens", ",".join(f"{t}:{scope}" for scope, t in tokens.items()),
         # Webhook paths need a gateway; nothing listens there, and the fuzzer's
         # bookings are days ahead, so none of them fires during the run.
         "--gateway-url", f"http://127.0.0.1:{free_port()}",
         "--data-dir", os.path.dirname(log_path)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "RUST_LOG": "info"},
    )
    addr = {}

    def serving():
        if proc.poll() is not None:
            raise SystemExit(f"api_fuzz: kairos exited at start:\n{open(log_path).read()}")
        for line in open(log_path):
            if "kairos is serving" in line:
                for word in line.split():
                    if word.startswith("listen="):
                        addr["base"] = "http://" + word[len("listen="):]
                        return True
        return False

    wait_until("kairos start", serving, 30)
    return proc, addr["base"]


def get(url, token=None):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_document(base, tokens):
    # Served without a token: generators are pointed at the URL.
    status, body = get(f"{base}/openapi.json")
    if status != 200:
        raise SystemExit(f"api_fuzz: GET /openapi.json without a token answered {status}, not 200")
    doc = json.loads(body)
    if not str(doc.get("openapi", "")).startswith("3.1"):
        raise SystemExit(f"api_fuzz: the document is OpenAPI {doc.get('openapi')}, not 3.1")
    operations = sum(
        1 for item in doc["paths"].values() for method in item
        if method in ("get", "put", "post", "delete", "patch")
    )
    print(f"api_fuzz: /openapi.json is OpenAPI {doc['openapi']} with {len(doc['paths'])} paths, "
          f"{operations} operations")
    return operations


# The one error of the fuzzer's own interpreter that is retried (see main).
TOOL_FAULT = "AST constructor recursion depth mismatch"

# Schemathesis's own generator gives up on some negative cases it builds itself (the
# complement of a schema, as a `not` it cannot draw from): "Failed to generate test cases
# for this API operation" with this reason. kairos's document has no `not`; whether the
# generator reaches such a case depends on how far it got in its time budget, so a run
# may or may not meet it. It is a limit of the tool, not a finding about kairos.
GENERATOR_LIMIT = "Schemathesis does not support"


def generator_limits_only(output):
    """The operations whose only errors are the generator's own limits, when every error
    of the run is one (and nothing failed); None otherwise."""
    if "FAILURES" in output or "= ERRORS =" not in output:
        return None
    errors = output.split("= ERRORS =", 1)[1]
    errors = errors.split("= WARNINGS =", 1)[0].split("= SUMMARY =", 1)[0]
    blocks, name = {}, None
    for line in errors.splitlines():
        stripped = line.strip()
        if stripped.startswith("___") and stripped.endswith("___"):
            name = stripped.strip("_ ")
            blocks[name] = []
        elif name is not None:
            blocks[name].append(line)
    if not blocks:
        return None
    for text in blocks.values():
        text = "\n".join(text)
        if "Schema Error" not in text or GENERATOR_LIMIT not in text:
            return None
    return sorted(blocks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kairos", required=True, help="the kairos binary")
    parser.add_argument("--max-time", type=int, default=90,
                        help="schemathesis's time budget in seconds (default 90)")
    # A fixed seed by default, so that CI runs the same cases each time (the time budget
    # still bounds how many); give another to look further.
    parser.add_argument("--seed", type=int, default=1, help="schemathesis's seed (default 1)")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"api_fuzz: {tool} is missing (apt-get install -y redis-server)")
    schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    seed = args.seed
    tokens = {scope: f"fuzz-{scope}-{secrets.token_hex(8)}" for scope in ("read", "book", "admin")}

    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="kairos-api-fuzz-")
    log_path = os.path.join(workdir, "kairos.log")
    procs = []
    status = 1
    try:
        redis, redis_port = start_redis(workdir)
        procs.append(redis)
        kairos, base = start_kairos(args.kairos, redis_port, tokens, log_path)
        procs.append(kairos)
        check_document(base, tokens)
        print(f"api_fuzz: schemathesis against {base} for {args.max_time} s, seed {seed}",
              flush=True)
        command = [schemathesis, "run", f"{base}/openapi.json",
                   "--header", f"Authorization: Bearer {tokens['admin']}",
                   "--checks", CHECKS,
                   "--max-time", str(args.max_time),
                   "--seed", str(seed),
                   # One worker: with two, hypothesis's threads can ast.parse a module at
                   # once, which CPython 3.11 before 3.11.8 is not safe for (TOOL_FAULT).
                   "--workers", "1",
                   "--request-timeout", "10",
                   "--suppress-health-check", "all"]
        for attempt in (1, 2):
            run = subprocess.run(
                command,
                timeout=args.max_time + 120,
                cwd=workdir,  # its own cache (.schemathesis/) goes with the run
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            print(run.stdout, flush=True)
            status = run.returncode
            # CPython 3.11 before 3.11.8 can raise this SystemError inside hypothesis
            # (its lambda descriptions parse source with `ast`, and two threads doing so
            # at once upset the parser's recursion count): a fault of the interpreter
            # under the fuzzer, not a finding about kairos. Run once more; any other
            # error or failure stands.
            if status != 0 and attempt == 1 and TOOL_FAULT in run.stdout \
                    and "FAILURES" not in run.stdout:
                print(f"api_fuzz: schemathesis hit the interpreter's `{TOOL_FAULT}`; running it once more",
                      flush=True)
                continue
            break
        if status != 0:
            limited = generator_limits_only(run.stdout)
            if limited:
                print("api_fuzz: schemathesis could not generate some cases of "
                      + ", ".join(limited) + " (its own limit, quoted above); every case "
                      "it did send passed the checks", flush=True)
                status = 0
        log = open(log_path).read()
        if "panicked" in log:
            print("api_fuzz: kairos panicked under the fuzzing:\n"
                  + "\n".join(l for l in log.splitlines() if "panicked" in l))
            status = status or 1
        if kairos.poll() is not None:
            print(f"api_fuzz: kairos died under the fuzzing ({kairos.returncode})")
            status = status or 1
        if status != 0:
            print(f"api_fuzz: failed; reproduce with --seed {seed}; the host's log:\n"
                  + "\n".join(log.splitlines()[-40:]))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"api_fuzz: {'ok' if status == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
