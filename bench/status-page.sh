#!/usr/bin/env bash
# The status page against a big cluster: starts a local 3-node cluster (cluster.sh,
# in a temporary directory), fills it with --sessions sessions each holding a lock
# (`leasehold-bench scale-sessions --hold`), and measures in headless Chromium how
# long the page takes to draw (bench/status_page_paint.py), on the leader's page and
# on a follower's. Then, on the same full cluster, --rounds rounds of lock cycles
# (`leasehold-bench run --workload lock-cycle`) three ways, alternating which goes
# first: with no page open, with the leader's page open (one /api/status request a
# second, as a tab sends), and with a search typed into it (a search walks every
# table). Stops everything it started, by process id.
#
#   bench/status-page.sh [--sessions 100000] [--loads 10] [--rounds 3] [--duration 10s]
set -euo pipefail

SESSIONS=100000
LOADS=10
ROUNDS=3
DURATION=10s
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) SESSIONS="$2"; shift 2 ;;
    --loads) LOADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "status-page.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$LEASEHOLD_ROOT"
leasehold_build
VENV="$CARGO_TARGET_DIR/python-venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "selenium>=4.20"

WORK="$(mktemp -d /tmp/leasehold-status-page.XXXXXX)"
export LEASEHOLD_CLUSTER_DIR="$WORK/cluster"
FILLER=""
POLLER=""
stop_pid() {
  if [ -n "$1" ]; then
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
  fi
}
cleanup() {
  stop_pid "$POLLER"
  stop_pid "$FILLER"
  ./cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

./cluster.sh start >"$WORK/start.log"
CA="$LEASEHOLD_CLUSTER_DIR/certs/ca.pem"
ADMIN_TOKEN="$LEASEHOLD_CLUSTER_DIR/admin.token"
ENDPOINTS="127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
PIDS="$(cat "$LEASEHOLD_CLUSTER_DIR"/node{1,2,3}.pid | paste -sd,)"
env LEASEHOLD_CA_FILE="$CA" "$LEASEHOLD_BIN/leasehold-bench" add-tenant --endpoints "$ENDPOINTS" --name bench \
  --admin-token-file "$ADMIN_TOKEN" --token-file "$WORK/bench.token" \
  --max-sessions 1000000 --max-holds 10000000 --max-waiters 10000000 >/dev/null
echo "status-page.sh: filling the cluster with $SESSIONS sessions, each holding a lock"
env LEASEHOLD_CA_FILE="$CA" LEASEHOLD_TOKEN_FILE="$WORK/bench.token" "$LEASEHOLD_BIN/leasehold-bench" scale-sessions \
  --endpoints "$ENDPOINTS" --pids "$PIDS" --sessions "$SESSIONS" --hold 3600s >"$WORK/fill.log" 2>&1 &
FILLER=$!
admin_status() {
  env LEASEHOLD_ENDPOINTS="$ENDPOINTS" LEASEHOLD_CA_FILE="$CA" LEASEHOLD_ADMIN_TOKEN_FILE="$ADMIN_TOKEN" \
    "$LEASEHOLD_BIN/leasehold" status --json
}
deadline=$((SECONDS + 1800))
sessions_applied() { admin_status | grep -o '"sessions":[0-9]*' | cut -d: -f2 | sort -n | head -1; }
until [ "$(sessions_applied || echo 0)" -ge "$SESSIONS" ]; do
  kill -0 "$FILLER" 2>/dev/null || { echo "status-page.sh: the filler stopped:" >&2; tail "$WORK/fill.log" >&2; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "status-page.sh: not filled within 30 minutes" >&2; exit 1; }
  sleep 5
done
tail -n 2 "$WORK/fill.log"
leader=$(admin_status | sed -n 's/.*"leader_id":\([0-9]*\).*/\1/p' | head -1)
follower=$(( leader % 3 + 1 ))
for node in "$leader" "$follower"; do
  role=follower
  [ "$node" = "$leader" ] && role=leader
  echo "== node $node ($role)"
  "$VENV/bin/python" bench/status_page_paint.py --url "https://127.0.0.1:740$node/" \
    --token-file "$ADMIN_TOKEN" --ca-file "$CA" --loads "$LOADS"
done

# The page's own requests, once a second (a new TLS connection each: heavier than a
# tab, which keeps one), until stopped.
poll_page() {
  while :; do
    curl -s -o /dev/null --cacert "$CA" -H "Authorization: Bearer $(head -1 "$ADMIN_TOKEN")" \
      "https://127.0.0.1:740$leader/api/status$1" || true
    sleep 1
  done
}
WAYS=(closed open searching)
for round in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2; do
    way=${WAYS[$(((k + round - 1) % 3))]}
    case "$way" in
      open) poll_page "" & POLLER=$! ;;
      searching) poll_page "?q=no-such-name-anywhere" & POLLER=$! ;;
    esac
    echo "== round $round: lock-cycle, page $way"
    env LEASEHOLD_CA_FILE="$CA" LEASEHOLD_TOKEN_FILE="$WORK/bench.token" "$LEASEHOLD_BIN/leasehold-bench" run \
      --target leasehold --endpoints "$ENDPOINTS" --workload lock-cycle --clients 64 --duration "$DURATION" \
      --warmup 2s --pids "$PIDS" --label "round=$round" --json-out "$WORK/$way.jsonl" | grep -v '^{'
    stop_pid "$POLLER"
    POLLER=""
  done
done
for way in "${WAYS[@]}"; do
  echo
  echo "Medians over $ROUNDS rounds, page $way:"
  "$LEASEHOLD_BIN/leasehold-bench" summarize "$WORK/$way.jsonl"
done
