#!/usr/bin/env bash
# Installs what the browser reward calculator needs, offline afterwards:
#   - the Pyodide runtime (CPython in WebAssembly), pinned in rewards/package-lock.json, into rewards/node_modules/
#     with npm (from Debian's npm when npm is missing), and its standard library precompiled to bytecode;
#   - with --browser: Debian's headless chromium + chromium-driver, which tests/test_reward_calculator.py drives.
# Each step is skipped when its result is already there. Run by `make calculator` and `make test`.
set -euo pipefail
cd "$(dirname "$0")"

need_apt() {  # apt-get needs root; say what to run otherwise
  if [ "$(id -u)" != 0 ]; then
    echo "rewards/install.sh: '$*' is missing; install it as root: apt-get install -y $*" >&2
    exit 1
  fi
  echo "rewards/install.sh: installing $* (apt-get)" >&2
  if [ -z "${APT_UPDATED:-}" ]; then apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ ! -f node_modules/pyodide/pyodide.asm.wasm ]; then
  command -v npm >/dev/null || need_apt npm
  echo "rewards/install.sh: fetching the Pyodide runtime (npm ci, pinned in package-lock.json) into rewards/node_modules" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi
# The standard library as bytecode (see precompile_stdlib.mjs): rebuilt whenever the runtime is newer.
if [ ! node_modules/pyodide/python_stdlib.pyc.zip -nt node_modules/pyodide/pyodide.asm.wasm ]; then
  node precompile_stdlib.mjs
fi

if [ "${1:-}" = "--browser" ]; then
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    need_apt chromium chromium-driver
  fi
fi
