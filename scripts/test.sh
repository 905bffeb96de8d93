#!/usr/bin/env bash
# Runs the whole test suite: the generated code's freshness, Rust unit and integration
# tests (against real MariaDB/MySQL; the cluster tests with real etcd and foqsd
# processes), then the Python client suite and the foqsctl shell pipeline against a
# running foqsd.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
mkdir -p "$FOQS_RUN"

foqsd_pid=""
py_config=""
cleanup() {
  if [ -n "$foqsd_pid" ]; then kill "$foqsd_pid" 2>/dev/null || true; wait "$foqsd_pid" 2>/dev/null || true; fi
  [ -n "$py_config" ] && rm -f "$py_config"
  foqs_mysql_stop
}
trap cleanup EXIT

foqs_log "checking that gen/ matches thrift/foqs.thrift"
scripts/gen-thrift.sh --check

foqs_mysql_ensure
export FOQS_TEST_MYSQL_URL="$FOQS_MYSQL_URL"
# The fault tests run private MariaDB servers of their own, which they freeze and kill.
command -v mariadb-install-db >/dev/null 2>&1 || foqs_apt_install mariadb-server
# The cluster tests run private etcd servers of their own (started and stopped by them).
foqs_etcd_install
foqs_log "MySQL for tests: $FOQS_TEST_MYSQL_URL"

foqs_log "Rust unit and integration tests"
cargo test --all-targets

foqs_log "Python client tests (Apache Thrift's Python library) against a running foqsd"
venv="$FOQS_RUN/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || { foqs_apt_install python3-venv && python3 -m venv "$venv"; }
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r integration/python/requirements.txt
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
py_config=$(mktemp "$FOQS_RUN/foqsd-py-XXXX.toml")
prefix="foqs_py_$$_"
foqs_config_for_mysql "$py_config" "$prefix"
RUST_LOG=warn ./target/debug/foqsd --config "$py_config" --listen "127.0.0.1:$port" &
foqsd_pid=$!
foqs_wait_port "$port" 30 || { foqs_log "foqsd did not start listening on $port"; exit 1; }
FOQS_ADDR="127.0.0.1:$port" "$venv/bin/python" -m pytest -q integration/python
foqs_log "foqsctl pipeline (bash) against the same foqsd"
cargo build --bins
FOQS_HOST="127.0.0.1:$port" bash integration/shell/pipeline.sh target/debug/foqsctl
kill -TERM "$foqsd_pid"
wait "$foqsd_pid" || { foqs_log "foqsd did not exit cleanly on SIGTERM"; exit 1; }
foqsd_pid=""
"$venv/bin/python" integration/python/drop_databases.py "$FOQS_MYSQL_URL" "$prefix" 4
foqs_log "all tests passed"
