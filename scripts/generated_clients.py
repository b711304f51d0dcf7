#!/usr/bin/env python3
"""Generates a Python and a TypeScript client from kairos's /openapi.json and drives
every kind of route through each, as a client developer would, with no hand edits.

Starts a redis-server and a `kairos serve` of its own on free loopback ports (helpers of
api_fuzz.py), fetches the document without a token, then:

- Python: `openapi-python-client generate` (PyPI) makes the package `kairos_client`;
  `mypy --strict` checks tests/clients/drive.py against it (the README's first booking
  among its calls); drive.py runs against the host: bookings point and term, a clash,
  list and filter, show, patch, cancel, a batch, /defer's JSON form, a timer, push and
  pull queues with bulk tasks, lease and ack, a plugin upload.
- TypeScript: `openapi-typescript` (npm) makes schema.d.ts; `tsc --strict` compiles
  tests/clients/drive.mts, whose calls are openapi-fetch's, typed by it; node runs it.

It fails when a generator cannot make a client, a typed script does not check, or a
route answers other than its types say.

Usage: generated_clients.py --kairos PATH --npm-prefix DIR [--component FILE.wasm]
(run with the Python of a venv holding openapi-python-client and mypy; DIR holds
openapi-typescript, openapi-fetch, typescript and @types/node: scripts/lib.sh's
need_client_generators installs both).
"""

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_fuzz import start_kairos, start_redis  # noqa: E402

CLIENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "clients")


def run(what, command, cwd, env=None, timeout=300):
    print(f"generated_clients: {what}", flush=True)
    done = subprocess.run(command, cwd=cwd, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print(done.stdout, flush=True)
        raise SystemExit(f"generated_clients: {what} failed ({done.returncode})")
    return done.stdout


def python_client(workdir, doc, base, token, component):
    bin_dir = os.path.dirname(sys.executable)
    out = run("openapi-python-client generate",
              [os.path.join(bin_dir, "openapi-python-client"), "generate", "--path", doc,
               "--output-path", os.path.join(workdir, "kairos_client"), "--meta", "none"],
              cwd=workdir)
    # The raw /defer/{path} routes take any body and are left out (their JSON form,
    # POST /defer, is the one for clients); any other warning is a schema it misread.
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")
                and " /defer/{path} " not in line]
    if warnings:
        print(out)
        raise SystemExit("generated_clients: openapi-python-client warned: " + "; ".join(warnings))
    shutil.copy(os.path.join(CLIENTS, "drive.py"), workdir)
    run("mypy --strict drive.py (and the generated package it imports)",
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "drive.py"], cwd=workdir)
    args = [sys.executable, "drive.py", base, token] + ([component] if component else [])
    print(run("the Python client against the host", args, cwd=workdir), end="")


def typescript_client(workdir, doc, base, token, npm_prefix):
    ts = workdir
    modules = os.path.join(os.path.abspath(npm_prefix), "node_modules")
    os.symlink(modules, os.path.join(ts, "node_modules"))
    tools = os.path.join(modules, ".bin")
    run("openapi-typescript", [os.path.join(tools, "openapi-typescript"), doc, "-o", "schema.d.ts"], cwd=ts)
    for name in ("drive.mts", "tsconfig.json"):
        shutil.copy(os.path.join(CLIENTS, name), ts)
    run("tsc --strict", [os.path.join(tools, "tsc"), "-p", "."], cwd=ts)
    print(run("the TypeScript client against the host",
              ["node", os.path.join("out", "drive.mjs"), base, token], cwd=ts), end="")


def with_host(kairos_bin, workdir, drive):
    """Starts a redis-server and a host in `workdir`, fetches the document, and calls
    `drive(workdir, document path, base URL, admin token)`; fails if the host panics."""
    os.makedirs(workdir)
    tokens = {scope: f"gen-{scope}-{secrets.token_hex(8)}" for scope in ("read", "book", "admin")}
    log_path = os.path.join(workdir, "kairos.log")
    procs = []
    try:
        redis, redis_port = start_redis(workdir)
        procs.append(redis)
        kairos, base = start_kairos(os.path.abspath(kairos_bin), redis_port, tokens, log_path)
        procs.append(kairos)
        doc = os.path.join(workdir, "openapi.json")
        # Without a token, as generators fetch it.
        with urllib.request.urlopen(f"{base}/openapi.json", timeout=10) as answer, open(doc, "wb") as f:
            f.write(answer.read())
        drive(workdir, doc, base, tokens["admin"])
        if kairos.poll() is not None:
            raise SystemExit("generated_clients: kairos died during the run")
        with open(log_path) as log:
            if "panicked" in log.read():
                raise SystemExit("generated_clients: kairos panicked during the run")
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kairos", required=True, help="the kairos binary")
    parser.add_argument("--npm-prefix", required=True, help="where the npm tools are installed")
    parser.add_argument("--component", help="a component to upload (plugins/noop)")
    args = parser.parse_args()
    if args.component:
        args.component = os.path.abspath(args.component)
    for tool in ("redis-server", "redis-cli", "node"):
        if shutil.which(tool) is None:
            raise SystemExit(f"generated_clients: {tool} is missing")
    workdir = tempfile.mkdtemp(prefix="kairos-clients-")
    # Each client against a host and a Redis of its own: both book the README's example.
    with_host(args.kairos, os.path.join(workdir, "py"),
              lambda dir_, doc, base, token: python_client(dir_, doc, base, token, args.component))
    with_host(args.kairos, os.path.join(workdir, "ts"),
              lambda dir_, doc, base, token: typescript_client(dir_, doc, base, token, args.npm_prefix))
    shutil.rmtree(workdir, ignore_errors=True)
    print("generated_clients: both clients drove every route as typed")


if __name__ == "__main__":
    main()
