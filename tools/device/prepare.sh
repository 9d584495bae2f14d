#!/usr/bin/env bash
# Builds what tools/device/figures.sh runs on a machine without the Rust
# toolchain (the 16-core machine of issues 42 and 43): the release binaries,
# stripped, and nats-server, into device-bin/ (ignored by git), which a
# device call carries. Usage: tools/device/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
server=$(tools/nats/install.sh)
cargo build --release --quiet -p delaywheel-cli -p delaywheel-nats
rm -rf device-bin
mkdir -p device-bin
for b in delaywheel delaywheel-nats delaywheel-nats-load; do
  strip -o "device-bin/$b" "target/release/$b"
done
cp "$server" device-bin/nats-server
git describe --always --dirty > device-bin/COMMIT
du -sh device-bin
