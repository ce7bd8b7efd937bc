#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Debian machine with Python 3.11 and pip.
# Every pip step uses constraints.txt, so nothing pulls a torch other than the pinned CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium for the browser tests (never a browser download).
if ! [ -x /usr/bin/chromium ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

python -m pip install --quiet -c constraints.txt -e ".[dev]"
