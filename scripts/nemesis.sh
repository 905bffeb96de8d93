#!/usr/bin/env bash
# The nemesis run (integration/rust/cluster_etcd/nemesis.rs): three foqsd hosts, an etcd
# member and a MariaDB server, each in its own network namespace (scripts/netns.sh), load
# through every host, and a seeded schedule of faults (cuts from etcd both ways and one
# way, a host cut from every node, kill -9, clocks skewed within and beyond the bound),
# then a drain and the checker's verdict: one JSON line (lost, stranded, duplicated
# at-most-once deliveries, overlapping leases, two owners; each must be 0).
#
#   bash scripts/nemesis.sh [SECONDS] [SEED]     # default 600 s, seed 1 (the suite runs
#                                                # 20 s, every fault kind once)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$FOQS_ROOT"
foqs_cargo_check
foqs_etcd_install
command -v mariadb-install-db >/dev/null 2>&1 || foqs_apt_install mariadb-server
foqs_faketime_install
foqs_nftables_install
seconds=${1:-600}
seed=${2:-1}
FOQS_NEMESIS_SECONDS=$seconds FOQS_NEMESIS_SEED=$seed \
  cargo test -q --test clusters cluster_etcd::nemesis::nemesis -- --exact --nocapture 2>&1 |
  grep -E '^nemesis |^\{"|^test result|panicked|lost |stranded |duplicated |overlapping '
