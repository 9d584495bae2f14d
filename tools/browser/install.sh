#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver from Debian, for the page's
# browser test (server/tests/page.rs), unless both are present already.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
