#!/usr/bin/env bash
# Makes sure Debian's headless Chromium is installed, for the tests that open pages in it (the run report; extra
# Debian packages named as arguments too, e.g. `scripts/ensure_chromium.sh chromium-driver`). Nothing is
# downloaded when everything is already there. Run by `make test`; installing needs root (CI runs as root).
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
for package in "$@"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  # Not fatal: the browser tests then skip, saying why (on CI, where CI is set, they fail instead).
  echo "scripts/ensure_chromium.sh: ${missing[*]} missing; install as root: apt-get install -y ${missing[*]}" >&2
  exit 0
fi
echo "scripts/ensure_chromium.sh: installing ${missing[*]} (apt-get) for the tests that open pages in headless Chromium" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
