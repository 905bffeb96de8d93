#!/usr/bin/env bash
# Builds foqsd and foqsctl in release mode and runs foqsd (listening on 127.0.0.1:9090).
#
#   bash scripts/run.sh                            on local SQLite files (conf/foqsd.toml,
#                                                  data in .run/data): nothing to start
#   bash scripts/run.sh --config conf/mysql.toml   on MySQL: makes sure one answers on
#                                                  127.0.0.1:3306, starting a private
#                                                  MariaDB when none does
#
# Other arguments go to foqsd, e.g. --listen 0.0.0.0:9090.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
config=conf/foqsd.toml
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --config=*) config=${1#--config=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
foqs_cargo_check
cargo build --release --bin foqsd --bin foqsctl
mkdir -p "$FOQS_RUN"
if grep -q '^url = "mysql://' "$config"; then
  foqs_mysql_ensure
  trap foqs_mysql_stop EXIT
  if [ "$FOQS_MYSQL_URL" != "mysql://root@127.0.0.1:3306" ]; then
    # A private MariaDB: the same config, pointed at it.
    local_config="$FOQS_RUN/$(basename "$config")"
    foqs_config_for_mysql "$local_config" foqs_shard_ "$config"
    config=$local_config
  fi
fi
foqs_log "starting foqsd with $config (stop it with Ctrl-C)"
# Not exec: the trap must stop a private MariaDB after foqsd exits.
./target/release/foqsd --config "$config" ${args[@]+"${args[@]}"}
