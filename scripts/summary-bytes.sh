#!/usr/bin/env bash
# What one peer summary weighs (issue 36): one foqsd on SQLite files in .run/, one item
# enqueued to each of 10 .. 12,000 topics, and the getHostInfo answer each peer polls
# every cluster.peer_poll_ms serialized (binary and compact protocols). One JSON line per
# size. A host sends and receives at most cluster.peer_fanout of these per peer_poll_ms
# per tier it serves, at any tier size.
#
#   bash scripts/summary-bytes.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
cargo build -q --bin foqsd
venv="$FOQS_RUN/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || { foqs_apt_install python3-venv && python3 -m venv "$venv"; }
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r integration/python/requirements.txt
mkdir -p "$FOQS_RUN"
config=$(mktemp "$FOQS_RUN/foqsd-summary-XXXX.toml")
data=$(mktemp -d "$FOQS_RUN/data-summary-XXXX")
foqs_config_for_sqlite "$config" "$data"
port=$(foqs_free_port)
RUST_LOG=warn ./target/debug/foqsd --config "$config" --listen "127.0.0.1:$port" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$config" "$data"' EXIT
foqs_wait_port "$port" 30 || { foqs_log "foqsd did not start listening on $port"; exit 1; }
"$venv/bin/python" scripts/summary-bytes.py "$port" 10 100 1000 10000 12000
