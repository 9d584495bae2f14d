# Sourced by the NATS tier's load scripts after they read their arguments:
# finds nats-server (NATS_SERVER, or tools/nats/install.sh) and the tier's
# binaries (DELAYWHEEL_BIN, or a release build made here), makes a scratch
# folder `work` and the list `pids`, both cleaned up at exit, and sources
# cluster.sh.
server=${NATS_SERVER:-$(tools/nats/install.sh)}
bin=${DELAYWHEEL_BIN:-target/release}
[[ -n ${DELAYWHEEL_BIN:-} ]] || cargo build --release --quiet -p delaywheel-nats

work=$(mktemp -d)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=tools/nats/cluster.sh
source tools/nats/cluster.sh
