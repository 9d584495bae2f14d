#!/usr/bin/env bash
# The real-client test of `delaywheel serve` with the official RocketMQ 5 Node
# client: installs the client (install.sh: into target/rocketmq-node), builds
# the binary, and runs test_serve.mjs against a server it starts itself, over
# plaintext, then over TLS (the server's --tls-cert, a certificate the test
# makes). Extra arguments go to test_serve.mjs.
set -euo pipefail
cd "$(dirname "$0")/../.."

modules=$(tools/rocketmq-client-node/install.sh)
cargo build --release --quiet -p delaywheel-cli
export ROCKETMQ_NODE_MODULES=$modules
node tools/rocketmq-client-node/test_serve.mjs target/release/delaywheel "$@"
node tools/rocketmq-client-node/test_serve.mjs target/release/delaywheel --tls "$@"
