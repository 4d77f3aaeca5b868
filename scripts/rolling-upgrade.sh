#!/usr/bin/env bash
# A rolling upgrade, checked: a 3-node cluster of an older leasehold-server build
# (--old PATH) serves a lock workload while its nodes are replaced one at a time by
# this checkout's build, each stopped with SIGTERM and started again on its own data
# directory with the same flags. Fails unless every node runs at the end, the
# workload saw no error, and the members' incarnations were recorded (which the
# leader does only once every member runs a build that knows the record).
#
#   scripts/rolling-upgrade.sh --old PATH/leasehold-server [--keep]
#
# Build an older commit's server without rebuilding RocksDB as bench/before-after.sh
# says. Uses ports 8811-8813 (clients) and 8821-8823 (peers) on 127.0.0.1, plaintext.
set -uo pipefail

OLD=""
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --old) OLD="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "rolling-upgrade.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$OLD" ] || { echo "rolling-upgrade.sh: --old must name a leasehold-server binary" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$LEASEHOLD_ROOT"
leasehold_build
NEW="$LEASEHOLD_BIN/leasehold-server"
CLI="$LEASEHOLD_BIN/leasehold"
BENCH="$LEASEHOLD_BIN/leasehold-bench"
WORK="$(mktemp -d /tmp/leasehold-upgrade.XXXXXX)"
declare -A PID=()
cleanup() {
  for i in "${!PID[@]}"; do kill -KILL "${PID[$i]}" 2>/dev/null || true; done
  for i in "${!PID[@]}"; do wait "${PID[$i]}" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ]; then echo "rolling-upgrade.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$CLI" new-token --prefix admin >"$WORK/admin.token" && chmod 600 "$WORK/admin.token"
members=()
for j in 1 2 3; do members+=(--initial-member "$j=127.0.0.1:881$j,127.0.0.1:882$j"); done
start() { # binary, node number
  RUST_LOG=info,openraft=warn "$1" --node-id "$2" --cluster-name upgrade --data-dir "$WORK/node$2" \
    --client-addr "127.0.0.1:881$2" --peer-addr "127.0.0.1:882$2" "${members[@]}" --insecure-plaintext \
    --admin-token-file "$WORK/admin.token" --worker-threads 1 >>"$WORK/node$2.log" 2>&1 &
  PID[$2]=$!
}
admin() { LEASEHOLD_ADMIN_TOKEN_FILE="$WORK/admin.token" "$CLI" "$@"; }
export LEASEHOLD_ENDPOINTS=127.0.0.1:8811,127.0.0.1:8812,127.0.0.1:8813 LEASEHOLD_INSECURE_PLAINTEXT=1
healthy() { # every node answers and one leads
  local status
  status="$(admin status --json 2>/dev/null)" || return 1
  grep -q '"state":"leader"' <<<"$status" && ! grep -q '"reachable":false' <<<"$status"
}
wait_healthy() {
  local deadline=$((SECONDS + 30))
  until healthy; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "rolling-upgrade.sh: FAIL: the cluster is not healthy after 30 s ($1)" >&2; exit 1; }
    sleep 0.2
  done
}

for i in 1 2 3; do start "$OLD" "$i"; done
wait_healthy "the old build's start"
admin tenant add work --token-file "$WORK/work.token" >/dev/null
LEASEHOLD_TOKEN_FILE="$WORK/work.token" "$BENCH" run --target leasehold --endpoints "$LEASEHOLD_ENDPOINTS" \
  --workload lock-cycle --clients 8 --duration 40s --warmup 1s --json-out "$WORK/bench.jsonl" >"$WORK/bench.out" 2>&1 &
bench=$!
sleep 5
for i in 1 2 3; do
  echo "rolling-upgrade.sh: node $i: SIGTERM, then this checkout's build on the same directory"
  kill -TERM "${PID[$i]}"
  wait "${PID[$i]}" 2>/dev/null
  start "$NEW" "$i"
  wait_healthy "node $i upgraded"
  sleep 5
done
wait "$bench" || { echo "rolling-upgrade.sh: FAIL: the workload failed" >&2; cat "$WORK/bench.out" >&2; exit 1; }
grep -v '^{' "$WORK/bench.out"
errors="$(grep -o '"errors":[0-9]*' "$WORK/bench.jsonl" | head -1 | cut -d: -f2)"
[ "${errors:-1}" = 0 ] || { echo "rolling-upgrade.sh: FAIL: the workload saw ${errors:-?} errors" >&2; exit 1; }
for i in 1 2 3; do
  kill -0 "${PID[$i]}" 2>/dev/null || { echo "rolling-upgrade.sh: FAIL: node $i is down" >&2; tail -5 "$WORK/node$i.log" >&2; exit 1; }
done
deadline=$((SECONDS + 10))
until [ "$(admin member list --json | grep -o '"incarnation":[1-9]' | wc -l)" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "rolling-upgrade.sh: FAIL: the members' incarnations were not recorded" >&2; exit 1; }
  sleep 0.2
done
admin member list
echo "rolling-upgrade.sh: upgraded under load: every node runs, no workload error, every member recorded"
