#!/usr/bin/env bash
# Runs foqsd with its storage ready: makes sure a MySQL answers (starting a private
# MariaDB when none does), builds foqsd in release mode and runs it with conf/foqsd.toml
# (listening on 127.0.0.1:9090). Extra arguments go to foqsd, e.g. --listen 0.0.0.0:9090.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_mysql_ensure
trap foqs_mysql_stop EXIT
cargo build --release --bin foqsd
mkdir -p "$FOQS_RUN"
config=conf/foqsd.toml
if [ "$FOQS_MYSQL_URL" != "mysql://root@127.0.0.1:3306" ]; then
  config="$FOQS_RUN/foqsd.toml"
  foqs_config_for_mysql "$config"
fi
foqs_log "starting foqsd with $config (stop it with Ctrl-C)"
# Not exec: the trap must stop a private MariaDB after foqsd exits.
./target/release/foqsd --config "$config" "$@"
