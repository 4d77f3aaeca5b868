#!/usr/bin/env bash
# Leasehold side by side with etcd and Redis on this machine, in the same run.
#
# Starts, on loopback and under one temporary folder:
#   * a 3-node Leasehold cluster (client ports 7411-7413, peer ports 7421-7423),
#   * a 3-member etcd 3.4 (client ports 7431-7433, peer ports 7441-7443), fsync on
#     (etcd's default),
#   * one Redis with appendonly yes + appendfsync always (port 7451),
# each Leasehold node and each etcd member with the same share of the machine's cores,
# since all six share it (--worker-threads for Leasehold, GOMAXPROCS for etcd: cores/3,
# at least 1; --threads-per-member sets another count for both),
# then runs every workload against each system, alternating which goes first, for
# --rounds rounds, and prints the medians and the ratios Leasehold/etcd and
# Leasehold/Redis. Everything it started is stopped by process id at exit, and the
# temporary folder is removed (--keep keeps it).
#
#   bench/compare.sh [--rounds 3] [--duration 10s] [--warmup 2s] [--clients 64]
#                    [--contended-clients 16] [--keepalive-clients 64]
#                    [--workloads lock-cycle,contended,keepalive,semaphore,failover]
#                    [--targets leasehold,etcd,redis] [--threads-per-member N]
#                    [--results FILE] [--keep]
set -euo pipefail

ROUNDS=3
DURATION=10s
WARMUP=2s
CLIENTS=64
CONTENDED_CLIENTS=16
KEEPALIVE_CLIENTS=64
WORKLOADS=lock-cycle,contended,keepalive,semaphore,failover
TARGETS=leasehold,etcd,redis
RESULTS=""
KEEP=0
THREADS=$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --contended-clients) CONTENDED_CLIENTS="$2"; shift 2 ;;
    --keepalive-clients) KEEPALIVE_CLIENTS="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    --threads-per-member) THREADS="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --threads-per-member must be a positive integer" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$LEASEHOLD_ROOT"

# ---------------------------------------------------------------- dependencies
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "compare.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
leasehold_build
BENCH="$LEASEHOLD_BIN/leasehold-bench"
SERVER="$LEASEHOLD_BIN/leasehold-server"
CLI="$LEASEHOLD_BIN/leasehold"

# ---------------------------------------------------------------- processes
WORK="$(mktemp -d /tmp/leasehold-compare.XXXXXX)"
declare -A PID=()   # name -> process id of everything this script started

cleanup() {
  for name in "${!PID[@]}"; do
    kill -CONT "${PID[$name]}" 2>/dev/null || true
    kill -KILL "${PID[$name]}" 2>/dev/null || true
  done
  for name in "${!PID[@]}"; do
    wait "${PID[$name]}" 2>/dev/null || true
  done
  if [ "$KEEP" = 1 ]; then
    echo "compare.sh: kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

LEASEHOLD_ENDPOINTS=127.0.0.1:7411,127.0.0.1:7412,127.0.0.1:7413
ETCD_ENDPOINTS=127.0.0.1:7431,127.0.0.1:7432,127.0.0.1:7433
REDIS_ENDPOINT=127.0.0.1:7451

start_leasehold() { # node number 1..3
  local i="$1" members=()
  for j in 1 2 3; do members+=(--initial-member "$j=127.0.0.1:741$j,127.0.0.1:742$j"); done
  RUST_LOG=warn "$SERVER" --node-id "$i" --cluster-name bench --data-dir "$WORK/leasehold$i" \
    --client-addr "127.0.0.1:741$i" --peer-addr "127.0.0.1:742$i" "${members[@]}" --worker-threads "$THREADS" \
    >>"$WORK/leasehold$i.log" 2>&1 &
  PID[leasehold$i]=$!
}

start_etcd() { # member number 1..3
  local i="$1"
  GOMAXPROCS="$THREADS" etcd --name "m$i" --data-dir "$WORK/etcd$i" \
    --listen-client-urls "http://127.0.0.1:743$i" --advertise-client-urls "http://127.0.0.1:743$i" \
    --listen-peer-urls "http://127.0.0.1:744$i" --initial-advertise-peer-urls "http://127.0.0.1:744$i" \
    --initial-cluster "m1=http://127.0.0.1:7441,m2=http://127.0.0.1:7442,m3=http://127.0.0.1:7443" \
    --initial-cluster-state new --initial-cluster-token leasehold-bench \
    --logger zap --log-level warn >>"$WORK/etcd$i.log" 2>&1 &
  PID[etcd$i]=$!
}

start_redis() {
  mkdir -p "$WORK/redis"
  redis-server --bind 127.0.0.1 --port 7451 --dir "$WORK/redis" --appendonly yes --appendfsync always \
    --save "" --daemonize no >>"$WORK/redis.log" 2>&1 &
  PID[redis]=$!
}

# Waits until a check passes, at most $2 seconds, naming what it waits for.
wait_until() {
  local what="$1" seconds="$2"; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "compare.sh: gave up waiting for $what after ${seconds}s" >&2
      exit 1
    fi
    sleep 0.2
  done
}

leasehold_ready() {
  local status
  status="$(LEASEHOLD_ENDPOINTS="$LEASEHOLD_ENDPOINTS" "$CLI" status --json)" || return 1
  grep -q '"state":"leader"' <<<"$status" && ! grep -q '"reachable":false' <<<"$status"
}
etcd_ready() { ETCDCTL_API=3 etcdctl --endpoints "$ETCD_ENDPOINTS" --command-timeout=2s endpoint health; }
redis_ready() { redis-cli -p 7451 ping | grep -q PONG; }

# Whether process $1 runs (a killed child stays a zombie until it is waited for).
alive() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ "$state" != Z* ]]
}

# Starts again, on the same data, every member of $1 whose process is gone (the
# failover workload kills a leader).
revive() {
  local system="$1"
  for i in 1 2 3; do
    if ! alive "${PID[$system$i]}"; then
      wait "${PID[$system$i]}" 2>/dev/null || true
      "start_$system" "$i"
    fi
  done
  wait_until "$system to be healthy" 60 "${system}_ready"
}

pids_of() {
  case "$1" in
    leasehold) echo "${PID[leasehold1]},${PID[leasehold2]},${PID[leasehold3]}" ;;
    etcd) echo "${PID[etcd1]},${PID[etcd2]},${PID[etcd3]}" ;;
    redis) echo "${PID[redis]}" ;;
  esac
}

endpoints_of() {
  case "$1" in
    leasehold) echo "$LEASEHOLD_ENDPOINTS" ;;
    etcd) echo "$ETCD_ENDPOINTS" ;;
    redis) echo "$REDIS_ENDPOINT" ;;
  esac
}

# Whether workload $2 means something on system $1.
measured() {
  case "$1:$2" in
    etcd:semaphore|redis:semaphore|redis:failover) return 1 ;;
    *) return 0 ;;
  esac
}

IFS=, read -r -a targets <<<"$TARGETS"
IFS=, read -r -a workloads <<<"$WORKLOADS"
# A port already taken would have a member exit at once and the benchmark measure
# whatever else answers there.
for port in 7411 7412 7413 7421 7422 7423 7431 7432 7433 7441 7442 7443 7451; do
  if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    echo "compare.sh: port 127.0.0.1:$port is already in use (another compare.sh run?)" >&2
    exit 1
  fi
done
for target in "${targets[@]}"; do
  case "$target" in
    leasehold) for i in 1 2 3; do start_leasehold "$i"; done ;;
    etcd) for i in 1 2 3; do start_etcd "$i"; done ;;
    redis) start_redis ;;
    *) echo "compare.sh: unknown target $target" >&2; exit 2 ;;
  esac
done
for target in "${targets[@]}"; do
  wait_until "$target to be healthy" 60 "${target}_ready"
done

echo "compare.sh: $(nproc) cores, $(uname -r), etcd $(etcd --version | head -1 | awk '{print $3}'), $(redis-server --version | awk '{print $3}'); data under $WORK"
echo "compare.sh: $ROUNDS rounds of $DURATION after a $WARMUP warm-up; $CLIENTS clients ($CONTENDED_CLIENTS contended, $KEEPALIVE_CLIENTS keepalive); $THREADS thread(s) per Leasehold node and etcd member"
LINES="$WORK/results.jsonl"
for round in $(seq 1 "$ROUNDS"); do
  # Alternate the order of the systems from round to round (A/B, B/A, …) so that
  # drift in the machine's load does not favour one of them.
  order=("${targets[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    reversed=()
    for ((k = ${#order[@]} - 1; k >= 0; k--)); do reversed+=("${order[$k]}"); done
    order=("${reversed[@]}")
  fi
  for workload in "${workloads[@]}"; do
    case "$workload" in
      contended) clients="$CONTENDED_CLIENTS" ;;
      keepalive) clients="$KEEPALIVE_CLIENTS" ;;
      *) clients="$CLIENTS" ;;
    esac
    for target in "${order[@]}"; do
      measured "$target" "$workload" || continue
      echo "== round $round: $workload on $target, $clients clients"
      "$BENCH" run --target "$target" --workload "$workload" --clients "$clients" \
        --duration "$DURATION" --warmup "$WARMUP" --endpoints "$(endpoints_of "$target")" \
        --pids "$(pids_of "$target")" --label "round=$round" --json-out "$LINES" |
        grep -v '^{' || echo "compare.sh: $workload on $target failed in round $round" >&2
      if [ "$workload" = failover ]; then
        revive "$target"
      fi
    done
  done
done

echo
echo "Medians over $ROUNDS rounds ($(nproc) cores, $DURATION per run, same machine, same run):"
"$BENCH" summarize "$LINES"
if [ -n "$RESULTS" ]; then
  cp "$LINES" "$RESULTS"
  echo "compare.sh: raw results in $RESULTS"
fi
