#!/usr/bin/env bash
# Runs the whole test suite: the generated code's freshness, Rust unit and integration
# tests (against real MariaDB/MySQL; the store conformance suite on MySQL and SQLite; the
# cluster tests with real etcd and foqsd processes), the integration tests that hold for
# every backend again on SQLite, then the Python and Node.js client suites (every transport
# their Thrift libraries offer) and the foqsctl shell pipeline against a running foqsd on
# the embedded default (and a TLS one on MySQL). The web console is tested in headless
# Chromium (integration/rust/console.rs). Last, a 60 s fuzzing pass over the Thrift edge
# (scripts/fuzz.sh).
#
#   bash scripts/test.sh               # the whole suite
#   bash scripts/test.sh --under-load  # the same with one busy core beside it (a busy
#                                      # loop at normal priority), for whoever changes timing
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
hog_pid=""
case "${1:-}" in
  "") ;;
  --under-load) ;;
  *) echo "usage: bash scripts/test.sh [--under-load]" >&2; exit 2 ;;
esac
foqs_cargo_check
mkdir -p "$FOQS_RUN"
# The test build needs about 6 GB under target/ (Cargo.toml's [profile.dev] says why it is
# no more). A full disk shows up as a linker error deep in cargo's output: say it first.
free_kb=$(df -Pk "${CARGO_TARGET_DIR:-$FOQS_ROOT}" 2>/dev/null | awk 'NR==2 {print $4}') || true
free_kb=${free_kb:-0}
foqs_log "disk: $((free_kb / 1024 / 1024)) GB free where target/ is built"
[ "$free_kb" -ge $((6 * 1024 * 1024)) ] ||
  foqs_log "warning: less than 6 GB free; the build may fail with 'No space left on device'"

foqsd_pid=""
tls_pid=""
py_config=""
tls_config=""
repl_pid=""
cleanup() {
  # The replication tests' process group: cargo, the test binary and what it started.
  [ -n "$repl_pid" ] && kill -- "-$repl_pid" 2>/dev/null
  for pid in $foqsd_pid $tls_pid $hog_pid; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  [ -n "$py_config" ] && rm -f "$py_config"
  [ -n "$tls_config" ] && rm -f "$tls_config"
  foqs_mysql_stop
}
trap cleanup EXIT
if [ "${1:-}" = --under-load ]; then
  # One core kept busy for the whole run, as a loaded CI machine would (stress-ng --cpu 1
  # does the same; a shell loop needs no install).
  sh -c 'while :; do :; done' &
  hog_pid=$!
  foqs_log "under load: a busy loop (pid $hog_pid) holds one core for the whole run"
fi

foqs_log "checking that gen/ matches thrift/foqs.thrift"
scripts/gen-thrift.sh --check
foqs_log "checking that no files of src/ import each other in a circle"
python3 scripts/check-circles.py

foqs_mysql_ensure
export FOQS_TEST_MYSQL_URL="$FOQS_MYSQL_URL"
# The fault tests run private MariaDB servers of their own, which they freeze and kill.
command -v mariadb-install-db >/dev/null 2>&1 || foqs_apt_install mariadb-server
# The cluster tests run private etcd servers of their own (started and stopped by them).
foqs_etcd_install
# The clock tests skew a foqsd's wall clock with libfaketime; the network tests cut links
# between namespaces with nftables.
foqs_faketime_install
foqs_nftables_install
# The console's tests run in a real browser: Debian's headless Chromium and chromedriver.
foqs_chromium_install
foqs_log "MySQL for tests: $FOQS_TEST_MYSQL_URL"
# Tests open hundreds of connections and threads: the limits they run under, for the record.
foqs_log "limits: $(ulimit -n) open files, $(ulimit -u) processes, listen backlog cap (somaxconn) $(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo unknown)"

# A whole-suite run builds everything once (CI's always starts from a fresh clone):
# incremental state would only add 1.2 GB to target/ and some 20 s to the build (measured
# on a fresh clone: 2 min 35 s and 3.1 GB with it, 2 min 17 s and 1.9 GB without).
# CARGO_INCREMENTAL=1 bash scripts/test.sh keeps it, for edit-and-rerun.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
foqs_log "building the Rust tests"
cargo test --all-targets --no-run
# The integration test binaries this script runs by name: a new [[test]] must be added here.
targets=$(sed -n '/^\[\[test\]\]/,/^name/ s/^name = "\(.*\)"/\1/p' Cargo.toml | sort | tr '\n' ' ')
if [ "$targets" != "clusters failpoints replication suite " ]; then
  foqs_log "Cargo.toml's [[test]] targets are: $targets; scripts/test.sh runs clusters, failpoints, replication and suite: add the new one"
  exit 1
fi
# The replication tests (replica sets of private MariaDB servers and etcd, about 2 minutes,
# mostly waiting on them: half a core) run beside the others, in their own process group
# and on their own half of the tests' port range (FOQS_TEST_PORT_SLICE).
foqs_log "the replication tests, beside the rest (log: $FOQS_RUN/replication-tests.log)"
FOQS_TEST_PORT_SLICE=1 setsid cargo test --test replication >"$FOQS_RUN/replication-tests.log" 2>&1 &
repl_pid=$!
export FOQS_TEST_PORT_SLICE=0
foqs_log "Rust unit and integration tests (MySQL; the store conformance suite on both stores)"
cargo test --lib --bins --test suite --test clusters --test failpoints
foqs_log "the integration tests that hold for every backend, again on SQLite shards"
FOQS_TEST_BACKEND=sqlite cargo test --test suite --test failpoints -- api:: background:: dedup:: dlq:: handoff:: \
  longpoll:: prefetch:: removal:: restart:: wire::
foqs_log "waiting for the replication tests"
repl_rc=0
wait "$repl_pid" || repl_rc=$?
repl_pid=""
if [ "$repl_rc" != 0 ]; then
  cat "$FOQS_RUN/replication-tests.log"
  foqs_log "the replication tests failed (exit $repl_rc); their output is above"
  exit 1
fi
grep -E "^test |^test result" "$FOQS_RUN/replication-tests.log" >&2

foqs_log "Python client tests (Apache Thrift's Python library) against a running foqsd"
venv="$FOQS_RUN/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || { foqs_apt_install python3-venv && python3 -m venv "$venv"; }
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r integration/python/requirements.txt
port=$(foqs_free_port)
# The embedded default (conf/foqsd.toml) with its files in a folder of this run.
py_config=$(mktemp "$FOQS_RUN/foqsd-py-XXXX.toml")
py_data=$(mktemp -d "$FOQS_RUN/data-py-XXXX")
prefix="foqs_py_$$_"
foqs_config_for_sqlite "$py_config" "$py_data"
# Its metrics listener, so the client suites can see which transport foqsd served.
metrics_port=$(foqs_free_port "$port")
printf '\n[metrics]\nlisten = "127.0.0.1:%s"\n' "$metrics_port" >>"$py_config"
RUST_LOG=warn ./target/debug/foqsd --config "$py_config" --listen "127.0.0.1:$port" &
foqsd_pid=$!
foqs_wait_port "$port" 30 || { foqs_log "foqsd did not start listening on $port"; exit 1; }
# A second foqsd, on MySQL, whose port speaks TLS, requires client certificates and
# applies access rules, for the Python TLS tests.
certs="$FOQS_RUN/certs"
bash scripts/certs.sh "$certs" alice 2>/dev/null
tls_port=$(foqs_free_port)
tls_config=$(mktemp "$FOQS_RUN/foqsd-tls-XXXX.toml")
foqs_config_for_mysql "$tls_config" "${prefix}tls_"
cat >>"$tls_config" <<TOML
[server.tls]
cert_file = "$certs/server.pem"
key_file = "$certs/server.key"
client_ca_file = "$certs/ca.pem"

[[access]]
identity = "alice"
namespaces = ["a"]
allow = ["produce", "consume"]
TOML
RUST_LOG=warn ./target/debug/foqsd --config "$tls_config" --listen "127.0.0.1:$tls_port" &
tls_pid=$!
foqs_wait_port "$tls_port" 30 || { foqs_log "the TLS foqsd did not start listening on $tls_port"; exit 1; }
FOQS_ADDR="127.0.0.1:$port" FOQS_METRICS_ADDR="127.0.0.1:$metrics_port" \
  FOQS_TLS_ADDR="127.0.0.1:$tls_port" FOQS_CERTS="$certs" \
  "$venv/bin/python" -m pytest -q integration/python
foqs_log "the docs' samples (docs/samples/, shown in the README) against the same foqsd"
FOQS_ADDR="127.0.0.1:$port" "$venv/bin/python" docs/samples/tour.py
PATH="$FOQS_ROOT/target/debug:$PATH" FOQS_HOST="127.0.0.1:$port" bash -euo pipefail docs/samples/tour.sh
foqs_log "Node.js client tests (npm's thrift package) against the same foqsd"
command -v npm >/dev/null 2>&1 || foqs_apt_install nodejs npm
(cd integration/node && npm ci --silent --no-audit --no-fund)
FOQS_ADDR="127.0.0.1:$port" FOQS_METRICS_ADDR="127.0.0.1:$metrics_port" \
  NODE_PATH="$FOQS_ROOT/integration/node/node_modules" node --test integration/node/
kill -TERM "$tls_pid"
wait "$tls_pid" || { foqs_log "the TLS foqsd did not exit cleanly on SIGTERM"; exit 1; }
tls_pid=""
foqs_log "foqsctl pipeline (bash) against the same foqsd"
# target/debug/foqsctl is the test build's (`cargo test --all-targets` builds the
# binaries, with the test features, as it built the foqsd above): a `cargo build --bins`
# here rebuilt foqs without them, 1-2 minutes of the suite for the same client.
[ -x target/debug/foqsctl ] || { foqs_log "target/debug/foqsctl is missing"; exit 1; }
FOQS_HOST="127.0.0.1:$port" bash integration/shell/pipeline.sh target/debug/foqsctl
kill -TERM "$foqsd_pid"
wait "$foqsd_pid" || { foqs_log "foqsd did not exit cleanly on SIGTERM"; exit 1; }
foqsd_pid=""
rm -rf "$py_data"
"$venv/bin/python" integration/python/drop_databases.py "$FOQS_MYSQL_URL" "${prefix}tls_" 4
foqs_log "a short fuzzing pass over the Thrift edge (scripts/fuzz.sh 60; longer runs: docs/testing.md)"
bash scripts/fuzz.sh 60
foqs_log "the fault-test network: namespaces, nftables cuts and heals (scripts/netns.sh check)"
bash scripts/netns.sh check
foqs_log "all tests passed"
