# Shared helpers for foqs scripts; source it: `. scripts/lib.sh`.
#
# MySQL for development and tests: foqs_mysql_ensure uses the server at FOQS_MYSQL_HOST:
# FOQS_MYSQL_PORT (default 127.0.0.1:3306, user root, empty password) when one answers
# there. Otherwise it starts a private MariaDB with its own datadir (.run/mariadb), its own
# port (FOQS_PRIVATE_MYSQL_PORT, default 3407) and its own socket, installing Debian's
# mariadb-server first when it is missing and we are root. foqs_mysql_stop stops only that
# private instance, by its pid; a shared server is never touched.
# Afterwards FOQS_MYSQL_URL is "mysql://root@HOST:PORT" (no database).

FOQS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FOQS_RUN="$FOQS_ROOT/.run"
FOQS_MYSQL_HOST=${FOQS_MYSQL_HOST:-127.0.0.1}
FOQS_MYSQL_PORT=${FOQS_MYSQL_PORT:-3306}
FOQS_PRIVATE_MYSQL_PORT=${FOQS_PRIVATE_MYSQL_PORT:-3407}
FOQS_PRIVATE_MYSQL_STARTED=""

foqs_log() { echo "[foqs] $*" >&2; }

foqs_apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    foqs_log "missing $*; install it with: sudo apt-get install $*"
    return 1
  fi
  foqs_log "installing $* from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}

# True when a server answers a TCP connection at host $1 port $2.
foqs_port_open() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# A port free now on 127.0.0.1, from 22000-22999: below the kernel's ephemeral range, which
# outgoing connections draw from (a port the kernel picked and released could be taken by
# one before the server that was to listen on it bound it). Ports given as arguments
# (picked already, not bound yet) are not picked again.
foqs_free_port() {
  python3 -c '
import random, socket, sys
taken = {int(a) for a in sys.argv[1:]}
for p in random.sample(range(22000, 23000), 1000):
    if p in taken:
        continue
    try:
        socket.socket().bind(("127.0.0.1", p)); print(p); break
    except OSError: pass' "$@"
}

# Waits up to $2 seconds for something to listen on 127.0.0.1 port $1; false if nothing does.
foqs_wait_port() {
  local i
  for i in $(seq 1 $(($2 * 4))); do
    foqs_port_open 127.0.0.1 "$1" && return 0
    sleep 0.25
  done
  foqs_port_open 127.0.0.1 "$1"
}

# Starts foqsd ($1: binary, $2: config, $3: listen address; its log in $4) in the
# background and waits until every shard is open: its port is bound before they are
# (opening a shard reads its counts), so it waits for the "foqsd listening" log line.
# Sets FOQS_FOQSD_PID; false, with a log line and the end of foqsd's log (backtrace frames
# left out: they would fill it), if foqsd exits or is not up in 10 min.
foqs_foqsd_start() {
  RUST_LOG=warn,foqs::daemon=info "$1" --config "$2" --listen "$3" >"$4" 2>&1 &
  FOQS_FOQSD_PID=$!
  local _
  for _ in $(seq 1 3000); do
    grep -q "foqsd listening" "$4" && return 0
    kill -0 "$FOQS_FOQSD_PID" 2>/dev/null || break
    sleep 0.2
  done
  foqs_log "foqsd did not start ($1 --config $2); the end of $4:"
  grep -v -e '^ *[0-9]*: ' -e '^ *at ' "$4" | tail -n 20 >&2 || true
  return 1
}

foqs_mysql_ensure() {
  if foqs_port_open "$FOQS_MYSQL_HOST" "$FOQS_MYSQL_PORT"; then
    FOQS_MYSQL_URL="mysql://root@$FOQS_MYSQL_HOST:$FOQS_MYSQL_PORT"
    export FOQS_MYSQL_URL
    return 0
  fi
  foqs_log "no MySQL at $FOQS_MYSQL_HOST:$FOQS_MYSQL_PORT; starting a private MariaDB on port $FOQS_PRIVATE_MYSQL_PORT"
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || foqs_apt_install mariadb-server || return 1
  local mariadbd=/usr/sbin/mariadbd
  command -v mariadbd >/dev/null 2>&1 && mariadbd=$(command -v mariadbd)
  local dir="$FOQS_RUN/mariadb"
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null &&
     foqs_port_open 127.0.0.1 "$FOQS_PRIVATE_MYSQL_PORT"; then
    foqs_log "reusing the private MariaDB already running (pid $(cat "$dir/pid"))"
  else
    if [ ! -d "$dir/data/mysql" ]; then
      mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 ||
        { foqs_log "mariadb-install-db failed; see $dir/install.log"; return 1; }
    fi
    "$mariadbd" --no-defaults --datadir="$dir/data" --port="$FOQS_PRIVATE_MYSQL_PORT" \
      --bind-address=127.0.0.1 --socket="$dir/mysqld.sock" --pid-file="$dir/pid" \
      --user="$(id -un)" --innodb-flush-log-at-trx-commit=1 --skip-name-resolve \
      --log-error="$dir/error.log" >/dev/null 2>&1 &
    foqs_wait_port "$FOQS_PRIVATE_MYSQL_PORT" 60 ||
      { foqs_log "private MariaDB did not start; see $dir/error.log"; return 1; }
    FOQS_PRIVATE_MYSQL_STARTED=1
  fi
  FOQS_MYSQL_HOST=127.0.0.1
  FOQS_MYSQL_PORT=$FOQS_PRIVATE_MYSQL_PORT
  FOQS_MYSQL_URL="mysql://root@127.0.0.1:$FOQS_PRIVATE_MYSQL_PORT"
  export FOQS_MYSQL_URL
}

# Stops the private MariaDB if this script started it.
foqs_mysql_stop() {
  local pidfile="$FOQS_RUN/mariadb/pid"
  if [ -n "$FOQS_PRIVATE_MYSQL_STARTED" ] && [ -f "$pidfile" ]; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    foqs_log "stopped the private MariaDB (pid $pid)"
  fi
}

foqs_cargo_check() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 ||
    { foqs_log "cargo is missing: install a Rust toolchain (1.89 or newer), e.g. with rustup"; return 1; }
  # etcd-client compiles etcd's .proto files when it builds, with `protoc`: the system's
  # when there is one, else the one the protoc-bin-vendored crate ships (a build
  # dependency, so `cargo fetch` brings it): no package to install.
  command -v protoc >/dev/null 2>&1 && return 0
  [ -n "${PROTOC:-}" ] && [ -x "$PROTOC" ] && return 0
  local registry="${CARGO_HOME:-$HOME/.cargo}/registry/src" arch p
  case "$(uname -m)" in
    x86_64) arch=linux-x86_64 ;;
    aarch64) arch=linux-aarch_64 ;;
    *) arch=none ;;
  esac
  p=$(ls -d "$registry"/*/protoc-bin-vendored-"$arch"-*/bin/protoc 2>/dev/null | tail -1 || true)
  if [ -z "$p" ]; then
    (cd "$FOQS_ROOT" && cargo fetch -q) || true
    p=$(ls -d "$registry"/*/protoc-bin-vendored-"$arch"-*/bin/protoc 2>/dev/null | tail -1 || true)
  fi
  if [ -n "$p" ]; then
    chmod +x "$p" 2>/dev/null || true
    export PROTOC="$p"
    return 0
  fi
  foqs_apt_install protobuf-compiler
}

# etcd for the cluster: FOQS_ETCD_PORT (default 23790) on 127.0.0.1. foqs_etcd_ensure uses
# an etcd already answering there, else starts a private one (data in .run/etcd, its peer
# port FOQS_ETCD_PEER_PORT, default 23800), installing Debian's etcd-server when missing.
# foqs_etcd_stop stops only an etcd this script started, by its pid.
FOQS_ETCD_PORT=${FOQS_ETCD_PORT:-23790}
FOQS_ETCD_PEER_PORT=${FOQS_ETCD_PEER_PORT:-23800}

foqs_etcd_install() {
  command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || foqs_apt_install etcd-server
}

# The console's browser tests drive Debian's Chromium through its chromedriver.
# Debian's libfaketime: the clock tests run a foqsd whose wall clock is skewed.
FOQS_FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
foqs_faketime_install() {
  [ -e "$FOQS_FAKETIME_LIB" ] || foqs_apt_install libfaketime
}

# Debian's nftables: the network tests cut links inside namespaces (scripts/netns.sh).
foqs_nftables_install() {
  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || foqs_apt_install nftables
}

foqs_chromium_install() {
  { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || foqs_apt_install chromium chromium-driver
}

foqs_etcd_ensure() {
  FOQS_ETCD_ENDPOINT="127.0.0.1:$FOQS_ETCD_PORT"
  export FOQS_ETCD_ENDPOINT
  foqs_port_open 127.0.0.1 "$FOQS_ETCD_PORT" && return 0
  foqs_etcd_install || return 1
  local dir="$FOQS_RUN/etcd"
  mkdir -p "$dir"
  local client="http://127.0.0.1:$FOQS_ETCD_PORT" peer="http://127.0.0.1:$FOQS_ETCD_PEER_PORT"
  foqs_log "starting a private etcd on $FOQS_ETCD_ENDPOINT (data in $dir)"
  etcd --name foqs --data-dir "$dir/data" --listen-client-urls "$client" \
    --advertise-client-urls "$client" --listen-peer-urls "$peer" \
    --initial-advertise-peer-urls "$peer" --initial-cluster "foqs=$peer" \
    >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/pid"
  foqs_wait_port "$FOQS_ETCD_PORT" 15 ||
    { foqs_log "etcd did not start; see $dir/etcd.log"; return 1; }
}

foqs_etcd_stop() {
  local pidfile="$FOQS_RUN/etcd/pid"
  if [ -f "$pidfile" ]; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null && foqs_log "stopped the private etcd (pid $pid)"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    rm -f "$pidfile"
  fi
}

# Writes a copy of conf/foqsd.toml to $1 with its SQLite files in folder $2 and without its
# web console: the console's port is fixed in that file, so a foqsd started from it (the
# README's first command) would keep this one from starting.
foqs_config_for_sqlite() {
  local out=$1 dir=$2
  sed -e "s#sqlite://../.run/data/#sqlite://$dir/#" \
    -e '/^\[console\]/,/^\[/ s/^listen = .*/# listen: none (foqs_config_for_sqlite)/' \
    "$FOQS_ROOT/conf/foqsd.toml" >"$out"
  grep -q "sqlite://$dir/" "$out" || { foqs_log "conf/foqsd.toml has no SQLite shards"; return 1; }
}

# Writes a copy of conf/mysql.toml (or $3) pointing at $FOQS_MYSQL_URL's server to $1, with the
# shard databases renamed by prefix $2 (default foqs_shard_).
foqs_config_for_mysql() {
  local out=$1 prefix=${2:-foqs_shard_} from=${3:-$FOQS_ROOT/conf/mysql.toml}
  local hostport=${FOQS_MYSQL_URL#mysql://root@}
  sed -e "s#mysql://root@127.0.0.1:3306/foqs_shard_#mysql://root@$hostport/$prefix#" \
    "$from" >"$out"
}
