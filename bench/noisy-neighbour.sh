#!/usr/bin/env bash
# Two tenants on one cluster: what one tenant's flood does to another's lock-cycle,
# in the same run.
#
# Starts a local cluster of its own (./cluster.sh start with its data under a
# temporary folder: 3 nodes, TLS, the ports of cluster.sh, so stop that one first;
# --server PATH runs another leasehold-server build, for a before/after), adds the
# tenants `quiet` and `noisy`, and runs, for --rounds rounds, each of:
#   quiet alone          tenant quiet: lock-cycle with --quiet-clients clients
#   noisy alone          tenant noisy: lock-cycle with --flood-clients clients
#   quiet + noisy        both at once, each its own leasehold-bench process
#   refused alone        tenant noisy: --flood-clients clients closing sessions that
#                        are gone (every command refused)
#   quiet + refused      both at once
# then prints the medians and the ratios that matter: the quiet tenant's throughput
# and p99 beside each flood against alone, and the flood's throughput beside the
# quiet tenant against alone. The flood's client runs on the same cores as the nodes
# (--flood-cpus pins it with taskset, closer to production, where clients do not
# share the nodes' machines). --flood-rate N gives the tenant `noisy` a rate quota of
# N commands a second (`tenant set-quotas --max-ops-per-second`), which its clients
# wait out. The cluster is stopped and removed at the end.
#
#   bench/noisy-neighbour.sh [--rounds 3] [--duration 10s] [--warmup 2s]
#                            [--quiet-clients 8] [--flood-clients 256]
#                            [--flood-cpus LIST] [--flood-rate N] [--server PATH]
#                            [--results FILE]
set -euo pipefail

ROUNDS=3
DURATION=10s
WARMUP=2s
QUIET_CLIENTS=8
FLOOD_CLIENTS=256
FLOOD_CPUS=""
FLOOD_RATE=""
RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --quiet-clients) QUIET_CLIENTS="$2"; shift 2 ;;
    --flood-clients) FLOOD_CLIENTS="$2"; shift 2 ;;
    --flood-cpus) FLOOD_CPUS="$2"; shift 2 ;;
    --flood-rate) FLOOD_RATE="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --server) export LEASEHOLD_SERVER="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "noisy-neighbour.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$LEASEHOLD_ROOT"
work="$(mktemp -d)"
results="${RESULTS:-$work/results.jsonl}"
: >"$results"
export LEASEHOLD_CLUSTER_DIR="$work/cluster"
cleanup() {
  ./cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

./cluster.sh start >/dev/null
eval "$(./cluster.sh env)"
echo "noisy-neighbour.sh: nodes run ${LEASEHOLD_SERVER:-$LEASEHOLD_BIN/leasehold-server}" >&2
bench="$LEASEHOLD_BIN/leasehold-bench"
for tenant in quiet noisy; do
  rate=()
  if [ "$tenant" = noisy ] && [ -n "$FLOOD_RATE" ]; then rate=(--max-ops-per-second "$FLOOD_RATE"); fi
  "$bench" add-tenant --endpoints "$LEASEHOLD_ENDPOINTS" --name "$tenant" --token-file "$work/$tenant.token" \
    "${rate[@]}" >/dev/null
done

# One leasehold-bench run as tenant $1 (label $2, workload $3, clients $4), its JSON
# line appended to the results.
run() {
  local tenant=$1 label=$2 workload=$3 clients=$4 pin=()
  if [ "$tenant" = noisy ] && [ -n "$FLOOD_CPUS" ]; then pin=(taskset -c "$FLOOD_CPUS"); fi
  LEASEHOLD_TOKEN_FILE="$work/$tenant.token" "${pin[@]}" "$bench" run --target leasehold \
    --endpoints "$LEASEHOLD_ENDPOINTS" --workload "$workload" --clients "$clients" \
    --duration "$DURATION" --warmup "$WARMUP" --label "$label" | grep '^{' >>"$results"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "noisy-neighbour.sh: round $round of $ROUNDS" >&2
  run quiet "quiet alone" lock-cycle "$QUIET_CLIENTS"
  run noisy "noisy alone" lock-cycle "$FLOOD_CLIENTS"
  run quiet "quiet beside noisy" lock-cycle "$QUIET_CLIENTS" &
  run noisy "noisy beside quiet" lock-cycle "$FLOOD_CLIENTS"
  wait
  run noisy "refused alone" refused "$FLOOD_CLIENTS"
  run quiet "quiet beside refused" lock-cycle "$QUIET_CLIENTS" &
  run noisy "refused beside quiet" refused "$FLOOD_CLIENTS"
  wait
done

python3 - "$results" "$QUIET_CLIENTS" "$FLOOD_CLIENTS" <<'EOF'
import json, statistics, sys
path, quiet_clients, flood_clients = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(path):
    report = json.loads(line)
    runs.setdefault(report["label"], []).append(report)
def median(label, key):
    values = [run[key] for run in runs.get(label, []) if run.get(key) is not None]
    return statistics.median(values) if values else float("nan")
print(f"| run ({quiet_clients} quiet clients, {flood_clients} flood clients) | ops/s | p99 ms |")
print("|---|---:|---:|")
for label in ["quiet alone", "quiet beside noisy", "quiet beside refused",
              "noisy alone", "noisy beside quiet", "refused alone", "refused beside quiet"]:
    print(f"| {label} | {median(label, 'operations_per_s'):,.0f} | {median(label, 'p99_ms'):.1f} |")
print()
def ratio(a, b, key):
    return median(a, key) / median(b, key)
print(f"quiet beside a flood of lock-cycles: {ratio('quiet beside noisy', 'quiet alone', 'operations_per_s'):.2f}x "
      f"its alone throughput, p99 {ratio('quiet beside noisy', 'quiet alone', 'p99_ms'):.2f}x")
print(f"quiet beside a flood of refused commands: {ratio('quiet beside refused', 'quiet alone', 'operations_per_s'):.2f}x "
      f"its alone throughput, p99 {ratio('quiet beside refused', 'quiet alone', 'p99_ms'):.2f}x")
print(f"the flood beside quiet: {ratio('noisy beside quiet', 'noisy alone', 'operations_per_s'):.2f}x its alone throughput")
EOF
