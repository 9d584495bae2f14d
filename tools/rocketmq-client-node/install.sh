#!/usr/bin/env bash
# Installs the official RocketMQ 5 Node client (rocketmq-client-nodejs, pinned
# in package.json and package-lock.json next to this script) into
# target/rocketmq-node/node_modules, and Node and npm themselves from Debian
# if they are missing. Does nothing when that install is already there and
# made from the same lock. Prints the folder holding node_modules.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/../../target/rocketmq-node"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
if ! cmp -s "$here/package-lock.json" "$dest/package-lock.json" ||
   ! cmp -s "$here/package.json" "$dest/package.json" ||
   [[ ! -f $dest/node_modules/rocketmq-client-nodejs/package.json ]]; then
  cp "$here/package.json" "$here/package-lock.json" "$dest/"
  # npm ci installs exactly the lock (and fails if it disagrees with
  # package.json). No install scripts: none of these packages needs one.
  (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "$dest"
