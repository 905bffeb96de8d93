#!/usr/bin/env bash
# A producer/consumer pipeline using only foqsctl, against the foqsd at $FOQS_HOST, plus
# foqsctl's contract: binary payloads round-trip, --json, exit codes 0/1/2/3.
#   FOQS_HOST=127.0.0.1:9090 integration/shell/pipeline.sh [path/to/foqsctl]
set -euo pipefail
ctl=${1:-target/debug/foqsctl}
ns=shell
topic="sh-$$-$RANDOM"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checks=0
fail() { echo "pipeline: FAILED: $*" >&2; exit 1; }
ok() { checks=$((checks + 1)); }
status() { set +e; "$@" >/dev/null 2>&1; local rc=$?; set -e; echo "$rc"; }

# Producer: 20 jobs.
for i in $(seq 1 20); do
  "$ctl" enqueue --ns "$ns" --topic "$topic" --priority $((i % 3)) --payload "job-$i" >/dev/null
done
ok

# Consumer: a hand-written worker loop (what foqsctl work replaces).
processed=0
while true; do
  set +e
  line=$("$ctl" dequeue --ns "$ns" --topic "$topic" --wait 500)
  rc=$?
  set -e
  [ "$rc" -eq 3 ] && break
  [ "$rc" -eq 0 ] || fail "dequeue exited $rc"
  id=${line%%$'\t'*}
  payload=${line##*$'\t'}
  [[ $payload == job-* ]] || fail "unexpected payload '$payload'"
  "$ctl" ack "$id" >/dev/null
  processed=$((processed + 1))
done
[ "$processed" -eq 20 ] || fail "processed $processed of 20 jobs"
ok

# Binary payload round trip through a file and --raw.
head -c 4096 /dev/urandom >"$tmp/in.bin"
"$ctl" enqueue --ns "$ns" --topic "$topic-bin" --payload-file "$tmp/in.bin" >/dev/null
"$ctl" dequeue --ns "$ns" --topic "$topic-bin" --raw >"$tmp/out.bin"
cmp -s "$tmp/in.bin" "$tmp/out.bin" || fail "binary payload changed"
ok

# Payload from standard input; --json output.
printf 'from stdin' | "$ctl" enqueue --ns "$ns" --topic "$topic-json" >/dev/null
json=$("$ctl" --json dequeue --ns "$ns" --topic "$topic-json")
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["payload"]=="from stdin" and d["delivery_count"]==1, d' "$json" ||
  fail "bad --json output: $json"
ok

# lease_id: dequeue --json shows it; nack/touch --lease-id act only on that delivery.
id=$("$ctl" enqueue --ns "$ns" --topic "$topic-lease" --payload leased)
json=$("$ctl" --json dequeue --ns "$ns" --topic "$topic-lease")
lease=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["lease_id"])' "$json")
[ "$lease" -gt 0 ] || fail "no lease_id in --json output: $json"
[ "$(status "$ctl" touch "$id" --extend-ms 60000 --lease-id $((lease + 1)))" = 1 ] || fail "touch with another lease_id should fail"
"$ctl" touch "$id" --extend-ms 60000 --lease-id "$lease" >/dev/null || fail "touch with the lease_id"
"$ctl" nack "$id" --lease-id "$lease" >/dev/null || fail "nack with the lease_id"
# Done again (a client that lost the reply retries and learns the truth), but settles
# nothing more: the lease is over for a touch, and another lease's nack is refused.
"$ctl" nack "$id" --lease-id "$lease" >/dev/null || fail "a retried nack of the same delivery is done again"
[ "$(status "$ctl" touch "$id" --extend-ms 60000 --lease-id "$lease")" = 1 ] || fail "a touch after the nack should fail"
[ "$(status "$ctl" nack "$id" --lease-id $((lease + 1)))" = 1 ] || fail "a nack of another delivery should fail"
ok

# Touch, nack to the dead letters, list them, requeue them all.
id=$("$ctl" enqueue --ns "$ns" --topic "$topic-dlq" --payload poison)
"$ctl" dequeue --ns "$ns" --topic "$topic-dlq" >/dev/null
"$ctl" touch "$id" --extend-ms 60000 >/dev/null
"$ctl" nack "$id" --to-dlq >/dev/null
# `grep >/dev/null`, not `grep -q`: -q exits at the first match, and under pipefail the
# foqsctl still writing after it (EPIPE, exit 1) would fail the line.
"$ctl" dlq list --ns "$ns" --topic "$topic-dlq" | grep "^$id" >/dev/null || fail "dead item not listed"
[ "$("$ctl" dlq requeue-all --ns "$ns" --topic "$topic-dlq")" = "requeued 1" ] || fail "requeue-all"
"$ctl" peek --ns "$ns" --topic "$topic-dlq" | grep "^$id" >/dev/null || fail "requeued item not ready"
"$ctl" topics --ns "$ns" | grep "^$topic-dlq	ready=1" >/dev/null || fail "topics"
"$ctl" stats --ns "$ns" --topic "$topic" | grep "^acked	20$" >/dev/null || fail "stats: 20 acked"
ok

# Every --transport (and protocol) carries the same calls.
for t in framed unframed header; do
  for p in binary compact; do
    id=$("$ctl" --transport "$t" --protocol "$p" enqueue --ns "$ns" --topic "$topic-$t" --payload "via-$t-$p")
    line=$("$ctl" --transport "$t" --protocol "$p" dequeue --ns "$ns" --topic "$topic-$t")
    [ "${line##*$'\t'}" = "via-$t-$p" ] || fail "--transport $t --protocol $p: got '$line'"
    "$ctl" --transport "$t" --protocol "$p" ack "$id" >/dev/null || fail "ack over $t $p"
  done
done
[ "$(status "$ctl" --transport http host-info)" = 2 ] || fail "--transport http is a usage error"
ok

# foqsctl work: the consumer loop without glue. Exit 0 acks, 65 dead-letters at once, any
# other status retries with backoff until --max-attempts sends it to the dead letters.
# (Waits on the worker's own lines, bounded; never a fixed sleep.)
wait_lines() { # FILE N: until FILE has N lines, at most 20 s
  local i
  for i in $(seq 1 400); do
    # The background worker's redirect makes the file as it starts: until then, nothing to count.
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "waited 20 s for $2 lines in $1: $(cat "$1")"
}
for p in ok dead fail; do "$ctl" enqueue --ns "$ns" --topic "$topic-work" --payload "$p" >/dev/null; done
# A free port below the kernel's ephemeral range, which outgoing connections draw from.
mport=$(python3 -c '
import random, socket
for p in random.sample(range(22000, 23000), 1000):
    try:
        socket.socket().bind(("127.0.0.1", p)); print(p); break
    except OSError: pass')
"$ctl" --json work --ns "$ns" --topic "$topic-work" --concurrency 2 --backoff 50,100 --max-attempts 2 \
  --metrics "127.0.0.1:$mport" \
  -- sh -c 'p=$(cat); case "$p" in ok) exit 0;; dead) exit 65;; *) exit 1;; esac' >"$tmp/work.log" &
worker=$!
wait_lines "$tmp/work.log" 4
# --metrics: the jobs by outcome, as the log says.
python3 - "$mport" <<'PY' || fail "work --metrics"
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
want = {"acked": 1, "retried": 1, "dead_lettered": 2}
for outcome, n in want.items():
    line = 'foqsctl_work_jobs_total{outcome="%s"} %d' % (outcome, n)
    assert line in text, (line, text)
PY
kill -TERM "$worker"
wait "$worker" || fail "work exited $? on SIGTERM"
python3 - "$tmp/work.log" <<'PY' || fail "work's outcomes: $(cat "$tmp/work.log")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
got = sorted((r["deliveries"], r["exit"], r["outcome"].split(" ")[0]) for r in rows)
assert got == [(1, 0, "acked"), (1, 1, "retry"), (1, 65, "dead-lettered"), (2, 1, "dead-lettered")], got
PY
[ "$("$ctl" dlq list --ns "$ns" --topic "$topic-work" | wc -l)" = 2 ] || fail "work: two dead letters"
ok

# A command that exits without reading its payload does not end the worker (foqsctl
# ended with SIGPIPE, 141, when the payload's write found the job gone).
"$ctl" enqueue --ns "$ns" --topic "$topic-unread" --payload "$(head -c 9000 /dev/zero | tr '\0' u)" >/dev/null
"$ctl" enqueue --ns "$ns" --topic "$topic-unread" --payload second >/dev/null
"$ctl" --json work --ns "$ns" --topic "$topic-unread" -- sh -c 'exit 0' >"$tmp/unread.log" &
worker=$!
wait_lines "$tmp/unread.log" 2
kill -TERM "$worker"
wait "$worker" || fail "work exited $? with a command that did not read its payload"
[ "$(grep -c '"acked"' "$tmp/unread.log")" = 2 ] || fail "unread payloads: $(cat "$tmp/unread.log")"
ok

# Retries back off exponentially from the item's delivery count: --backoff 300,5000 waits
# 300 x 2^(deliveries-1) ms, jittered over its upper half, so the gaps between deliveries
# are at least 150, 300 and 600 ms (lower bounds only: a loaded machine adds, never takes).
"$ctl" enqueue --ns "$ns" --topic "$topic-backoff" --payload again >/dev/null
"$ctl" --json work --ns "$ns" --topic "$topic-backoff" --backoff 300,5000 --max-attempts 4 \
  -- sh -c "date +%s%N >>$tmp/deliveries; exit 1" >"$tmp/backoff.log" &
worker=$!
wait_lines "$tmp/backoff.log" 4
kill -TERM "$worker"
wait "$worker" || fail "work exited $?"
python3 - "$tmp/deliveries" <<'PY' || fail "backoff: $(cat "$tmp/backoff.log")"
import sys
t = [int(l) / 1e6 for l in open(sys.argv[1])]
gaps = [b - a for a, b in zip(t, t[1:])]
assert len(gaps) == 3, gaps
for gap, least in zip(gaps, [150, 300, 600]):
    assert gap >= least, (gaps, least)
PY
grep -c "dead-lettered" "$tmp/backoff.log" >/dev/null || fail "backoff: the fourth failure is dead-lettered: $(cat "$tmp/backoff.log")"
ok

# A job longer than its lease is renewed, not delivered twice (lease 1 s, job 2.5 s).
"$ctl" enqueue --ns "$ns" --topic "$topic-long" --lease-ms 1000 --payload slow >/dev/null
"$ctl" --json work --ns "$ns" --topic "$topic-long" -- sh -c 'sleep 2.5' >"$tmp/long.log" &
worker=$!
wait_lines "$tmp/long.log" 1
kill -TERM "$worker"
wait "$worker" || fail "work exited $?"
python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read()); assert r["outcome"]=="acked" and r["deliveries"]==1, r' "$tmp/long.log" ||
  fail "the long job: $(cat "$tmp/long.log")"
"$ctl" stats --ns "$ns" --topic "$topic-long" | grep "^delivered	1$" >/dev/null || fail "the long job was delivered twice"
ok

# SIGTERM mid-job: the job gets --grace, then is killed, and its item is given back (ready
# again at once), and work exits 0.
"$ctl" enqueue --ns "$ns" --topic "$topic-stop" --payload stuck >/dev/null
"$ctl" work --ns "$ns" --topic "$topic-stop" --grace 200 -- sh -c "touch $tmp/started; exec sleep 60" >"$tmp/stop.log" &
worker=$!
for i in $(seq 1 400); do [ -e "$tmp/started" ] && break; sleep 0.05; done
[ -e "$tmp/started" ] || fail "the job never started"
kill -TERM "$worker"
wait "$worker" || fail "work exited $? after SIGTERM"
grep "	released	" "$tmp/stop.log" >/dev/null || fail "the stopped job's item: $(cat "$tmp/stop.log")"
"$ctl" peek --ns "$ns" --topic "$topic-stop" | grep "stuck$" >/dev/null || fail "the item is not ready again"
ok

# --concurrency 2: never more than two jobs at once (each job counts those running as it
# starts, by marker directories).
for i in 1 2 3 4 5 6; do "$ctl" enqueue --ns "$ns" --topic "$topic-conc" --payload "c$i" >/dev/null; done
"$ctl" work --ns "$ns" --topic "$topic-conc" --concurrency 2 -- sh -c \
  "mkdir $tmp/run.\$FOQS_ID.d; ls -d $tmp/run.*.d | wc -l >>$tmp/conc.n; sleep 0.3; rmdir $tmp/run.\$FOQS_ID.d" >"$tmp/conc.log" &
worker=$!
wait_lines "$tmp/conc.log" 6
kill -TERM "$worker"
wait "$worker" || fail "work exited $?"
[ "$(sort -n "$tmp/conc.n" | tail -1)" -le 2 ] || fail "more than 2 jobs at once: $(tr '\n' ' ' <"$tmp/conc.n")"
[ "$(grep -c "	acked	" "$tmp/conc.log")" = 6 ] || fail "concurrency: $(cat "$tmp/conc.log")"
ok

# --timeout: the job's whole process group is killed, and the item retried (here: dead at
# its one attempt).
"$ctl" enqueue --ns "$ns" --topic "$topic-slow" --payload slow >/dev/null
"$ctl" work --ns "$ns" --topic "$topic-slow" --timeout 300 --max-attempts 1 -- sh -c \
  "echo \$\$ >$tmp/pgid; sleep 60 & sleep 60" >"$tmp/slow.log" 2>/dev/null &
worker=$!
wait_lines "$tmp/slow.log" 1
kill -TERM "$worker"
wait "$worker" || fail "work exited $?"
grep "	dead-lettered	" "$tmp/slow.log" >/dev/null || fail "timeout: $(cat "$tmp/slow.log")"
# Killed members may linger a moment as zombies (until reaped): none may be alive.
alive() { ps -eo pgid=,stat= | awk -v g="$(cat "$tmp/pgid")" '$1 == g && $2 !~ /^Z/' | grep -c . || true; }
for i in $(seq 1 40); do [ "$(alive)" = 0 ] && break; sleep 0.05; done
[ "$(alive)" = 0 ] || fail "the timed-out job's process group lives on"
ok

# Usage errors exit 2: no command, --concurrency 0, a bad --backoff.
[ "$(status "$ctl" work --ns "$ns" --topic t)" = 2 ] || fail "work without a command should exit 2"
[ "$(status "$ctl" work --ns "$ns" --topic t --concurrency 0 -- true)" = 2 ] || fail "--concurrency 0 should exit 2"
[ "$(status "$ctl" work --ns "$ns" --topic t --backoff 5 -- true)" = 2 ] || fail "a bad --backoff should exit 2"
[ "$(status "$ctl" work --ns "$ns" -- true)" = 2 ] || fail "work without a topic should exit 2"
ok

# foqsctl watch: one JSON object per refresh with --json, the namespace's topics in it.
for i in 1 2 3; do "$ctl" enqueue --ns "$ns-watch" --topic "$topic-w" --payload w >/dev/null; done
"$ctl" --json watch --ns "$ns-watch" --interval 100 --count 2 >"$tmp/watch.log" || fail "watch exited $?"
python3 - "$tmp/watch.log" "$topic-w" <<'PY' || fail "watch: $(cat "$tmp/watch.log")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2, rows
t = [x for x in rows[1]["topics"] if x["topic"] == sys.argv[2]]
assert t and t[0]["ready"] == 3 and t[0]["enqueued_per_s"] == 0.0, rows
PY
"$ctl" watch --ns "$ns-watch" --count 1 | grep "^$topic-w  *3 " >/dev/null || fail "watch's table"
ok

# watch's counts are topicStats' (ready, deferred, leased, dead), field by field.
for i in 1 2 3 4; do "$ctl" enqueue --ns "$ns-watch" --topic "$topic-wc" --payload w >/dev/null; done
"$ctl" enqueue --ns "$ns-watch" --topic "$topic-wc" --payload later --delay-ms 600000 >/dev/null
"$ctl" dequeue --ns "$ns-watch" --topic "$topic-wc" >/dev/null
dead_id=$("$ctl" dequeue --ns "$ns-watch" --topic "$topic-wc" | cut -f1)
"$ctl" nack --to-dlq "$dead_id" >/dev/null
"$ctl" --json watch --ns "$ns-watch" --topic "$topic-wc" --count 1 >"$tmp/wc.watch"
"$ctl" --json stats --ns "$ns-watch" --topic "$topic-wc" >"$tmp/wc.stats"
python3 - "$tmp/wc.watch" "$tmp/wc.stats" "$topic-wc" <<'PY' || fail "watch against stats: $(cat "$tmp/wc.watch" "$tmp/wc.stats")"
import json, sys
w = [t for t in json.load(open(sys.argv[1]))["topics"] if t["topic"] == sys.argv[3]][0]
s = json.load(open(sys.argv[2]))
want = {"ready": 2, "deferred": 1, "leased": 1, "dead": 1}
for k, v in want.items():
    assert w[k] == s[k] == v, (k, w[k], s[k], v)
PY
ok

# Exit codes.
[ "$(status "$ctl" dequeue --ns "$ns" --topic "$topic-empty")" = 3 ] || fail "empty dequeue should exit 3"
[ "$(status "$ctl" peek --ns "$ns" --topic "$topic-empty")" = 3 ] || fail "empty peek should exit 3"
[ "$(status "$ctl" dequeue --ns "$ns")" = 2 ] || fail "usage error should exit 2"
[ "$(status "$ctl" ack 0:999999999)" = 1 ] || fail "failed ack should exit 1"
[ "$(status "$ctl" --host 127.0.0.1:1 host-info)" = 1 ] || fail "connection error should exit 1"
[ "$(status "$ctl" host-info)" = 0 ] || fail "host-info should exit 0"
ok

# A reader that goes away first ends foqsctl quietly, as it ends Unix tools (before:
# "Broken pipe", exit 1). The reader closes its end at once, before foqsctl (which first
# connects to foqsd) writes anything.
set +e
"$ctl" host-info 2>"$tmp/pipe.err" | { exec 0<&-; sleep 0.5; }
rc=${PIPESTATUS[0]}
set -e
[ ! -s "$tmp/pipe.err" ] || fail "a closed pipe made foqsctl complain: $(cat "$tmp/pipe.err")"
{ [ "$rc" = 0 ] || [ "$rc" = 141 ]; } || fail "a closed pipe: foqsctl exited $rc (want 141: SIGPIPE, or 0)"
ok

echo "foqsctl pipeline: $checks passed, 0 failed"
