# Sourced by the NATS tier's load scripts: a 3-node JetStream cluster on
# 127.0.0.1 and the tier's nodes on it. The caller sets `server` (the
# nats-server binary), `bin` (the folder of delaywheel-nats) and `work` (a
# scratch folder), and keeps `pids` (killed by its cleanup).
#   start_cluster            starts n0..n2 and waits until they have a
#                            JetStream meta leader; sets `urls` (comma-separated)
#   start_node NAME ARGS...  starts a tier node, retrying until the cluster
#                            has a meta leader; sets `node_pid`
#   free_port                prints a free TCP port of 127.0.0.1
#   py                       the Python interpreter itself (not a shim that
#                            starts one: a shell and a search per call)

py=$(python3 -c 'import sys; print(sys.executable)')
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_cluster() {
  local client_ports route_ports monitor routes i
  client_ports=("$(free_port)" "$(free_port)" "$(free_port)")
  route_ports=("$(free_port)" "$(free_port)" "$(free_port)")
  monitor=$(free_port)
  routes=$(printf '"nats-route://127.0.0.1:%s", ' "${route_ports[@]}")
  for i in 0 1 2; do
    cat > "$work/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:${client_ports[$i]}
jetstream { store_dir: "$work/n$i" }
cluster { name: load, listen: 127.0.0.1:${route_ports[$i]}, routes: [${routes%, }] }
CONF
    [[ $i != 0 ]] || echo "http: 127.0.0.1:$monitor" >> "$work/n$i.conf"
    "$server" -c "$work/n$i.conf" > "$work/n$i.log" 2>&1 &
    pids+=($!)
  done
  urls=$(printf 'nats://127.0.0.1:%s,' "${client_ports[@]}")
  urls=${urls%,}
  "$py" - "$monitor" <<'PY' || { echo "the cluster elected no JetStream meta leader; see $work/n*.log" >&2; exit 1; }
import json, sys, time, urllib.request
deadline = time.time() + 60
while time.time() < deadline:
    try:
        jsz = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/jsz", timeout=2))
        if jsz.get("meta_cluster", {}).get("leader"):
            sys.exit(0)
    except Exception:  # not up yet, or a reply cut short: ask again
        pass
    time.sleep(0.2)
sys.exit(1)
PY
}

# The first node creates the delay stream and the lease bucket once the
# cluster has a meta leader; it exits until then, so it is started again.
start_node() {
  local name=$1
  shift
  for _ in $(seq 50); do
    # The tier's own warnings stay: a filter's target matches by prefix, so
    # `delaywheel=error` alone silences `delaywheel_nats` too.
    RUST_LOG=warn,delaywheel=error,delaywheel_nats=warn "$bin/delaywheel-nats" --nats "$urls" --node-id "$name" --dir "$work/tier-$name" \
      "$@" >> "$work/tier-$name.log" 2>&1 &
    node_pid=$!
    sleep 1
    if kill -0 "$node_pid" 2>/dev/null; then pids+=("$node_pid"); return; fi
  done
  echo "tier node $name did not start; see $work/tier-$name.log" >&2
  exit 1
}
