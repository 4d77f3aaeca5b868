#!/usr/bin/env bash
# Leasehold side by side with etcd and Redis on this machine, in the same run.
#
# Starts, on loopback and under one temporary folder:
#   * `leasehold`: a 3-node Leasehold cluster run the way production runs it: TLS on
#     the client ports 7411-7413, mutual TLS on the peer ports 7421-7423, an admin
#     token, and a tenant `bench` whose bearer token every benchmark request carries,
#   * `leasehold-plaintext`: the same cluster with --insecure-plaintext (client ports
#     7461-7463, peer ports 7471-7473; admin token and tenant alike), so that the same
#     run shows what TLS costs (the TLS/plaintext column),
#   * `etcd`: a 3-member etcd 3.4 with TLS on the client ports 7431-7433 and mutual
#     TLS on the peer ports 7441-7443, fsync on (etcd's default), no authentication
#     (--etcd-plaintext: no TLS either),
#   * `redis`: one Redis, plaintext, appendonly yes + appendfsync always (port 7451),
# with every certificate from one throwaway CA made in that folder (`leasehold cert`),
# each Leasehold node and each etcd member with the same share of the machine's cores,
# since the members of a system share it (--worker-threads for Leasehold, GOMAXPROCS
# for etcd: cores/3, at least 1; --threads-per-member sets another count for both),
# then runs every workload against each target, alternating which goes first, for
# --rounds rounds, and prints the medians and the ratios Leasehold/etcd,
# Leasehold/Redis and Leasehold TLS/plaintext. Everything it started is stopped by
# process id at exit, and the temporary folder is removed (--keep keeps it).
#
# The workload `noisy-neighbour` is two teams on one system: team `quiet` runs
# lock-cycle with --quiet-clients clients, team `noisy` with --flood-clients, first
# each alone, then both at once (on Leasehold each team is a tenant of its own; on
# etcd each has its own key prefix, which is what etcd offers). It prints, per
# system, the quiet team's throughput and p99 beside the flood against alone, and the
# flood's throughput beside the quiet team against alone. Redis is not run: one
# Redis is one node, not a replicated lock service.
#
#   bench/compare.sh [--rounds 3] [--duration 10s] [--warmup 2s] [--clients 64]
#                    [--contended-clients 16] [--keepalive-clients 64]
#                    [--quiet-clients 8] [--flood-clients 256]
#                    [--workloads lock-cycle,contended,keepalive,semaphore,failover,noisy-neighbour]
#                    [--targets leasehold,leasehold-plaintext,etcd,redis]
#                    [--threads-per-member N] [--etcd-plaintext]
#                    [--results FILE] [--keep]
set -euo pipefail

ROUNDS=3
DURATION=10s
WARMUP=2s
CLIENTS=64
CONTENDED_CLIENTS=16
KEEPALIVE_CLIENTS=64
QUIET_CLIENTS=8
FLOOD_CLIENTS=256
WORKLOADS=lock-cycle,contended,keepalive,semaphore,failover,noisy-neighbour
TARGETS=leasehold,leasehold-plaintext,etcd,redis
RESULTS=""
KEEP=0
ETCD_TLS=1
THREADS=$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --contended-clients) CONTENDED_CLIENTS="$2"; shift 2 ;;
    --keepalive-clients) KEEPALIVE_CLIENTS="$2"; shift 2 ;;
    --quiet-clients) QUIET_CLIENTS="$2"; shift 2 ;;
    --flood-clients) FLOOD_CLIENTS="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    --threads-per-member) THREADS="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --etcd-plaintext) ETCD_TLS=0; shift ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --threads-per-member must be a positive integer" >&2; exit 2; }
IFS=, read -r -a targets <<<"$TARGETS"
for target in "${targets[@]}"; do
  case "$target" in
    leasehold|leasehold-plaintext|etcd|redis) ;;
    *) echo "compare.sh: unknown target $target (leasehold, leasehold-plaintext, etcd, redis)" >&2; exit 2 ;;
  esac
done

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$LEASEHOLD_ROOT"
# The caller's own client settings (`./cluster.sh env`, say) would point a client at
# another cluster or contradict the ones given below, target by target.
unset LEASEHOLD_ENDPOINTS LEASEHOLD_CA_FILE LEASEHOLD_TOKEN_FILE LEASEHOLD_TOKEN LEASEHOLD_CERT_FILE \
  LEASEHOLD_KEY_FILE LEASEHOLD_INSECURE_PLAINTEXT LEASEHOLD_ADMIN_TOKEN_FILE

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

# ---------------------------------------------------------------- credentials
# One throwaway CA signs every certificate: Leasehold node i's (node-i.leasehold,
# what its peers check, and 127.0.0.1, what clients dial) and etcd member i's
# (node-1i, for its 127.0.0.1). The admin token is the same for both Leasehold
# clusters; each gets its own tenant `bench` (tokens written once they are healthy).
CERTS="$WORK/certs"
CA_FILE="$CERTS/ca.pem"
ADMIN_TOKEN_FILE="$CERTS/admin.token"
"$CLI" cert ca "$CERTS" >/dev/null
for i in 1 2 3; do
  "$CLI" cert node "$CERTS" --id "$i" --host 127.0.0.1 >/dev/null
  "$CLI" cert node "$CERTS" --id "1$i" --host 127.0.0.1 >/dev/null
done
(umask 077 && "$CLI" new-token --prefix admin >"$ADMIN_TOKEN_FILE")
tenant_token_file() { echo "$CERTS/$1.${2:-bench}.token"; } # Leasehold target, tenant (bench)

# Client and peer port prefixes of each Leasehold target: node i listens on <prefix>i.
declare -A CLIENT_PORTS=([leasehold]=741 [leasehold-plaintext]=746)
declare -A PEER_PORTS=([leasehold]=742 [leasehold-plaintext]=747)
ETCD_ENDPOINTS=127.0.0.1:7431,127.0.0.1:7432,127.0.0.1:7433
ETCD_SCHEME=http
[ "$ETCD_TLS" = 1 ] && ETCD_SCHEME=https
REDIS_ENDPOINT=127.0.0.1:7451

start_leasehold() { # target (leasehold or leasehold-plaintext), node number 1..3
  local target="$1" i="$2" members=() security=()
  local client="${CLIENT_PORTS[$target]}" peer="${PEER_PORTS[$target]}"
  for j in 1 2 3; do members+=(--initial-member "$j=127.0.0.1:$client$j,127.0.0.1:$peer$j"); done
  if [ "$target" = leasehold ]; then
    # One certificate for both ports, as cluster.sh does; clients authenticate with
    # bearer tokens (no --client-ca).
    security=(--tls-cert "$CERTS/node-$i.pem" --tls-key "$CERTS/node-$i.key"
      --peer-cert "$CERTS/node-$i.pem" --peer-key "$CERTS/node-$i.key" --peer-ca "$CA_FILE")
  else
    security=(--insecure-plaintext)
  fi
  RUST_LOG=warn "$SERVER" --node-id "$i" --cluster-name bench --data-dir "$WORK/$target$i" \
    --client-addr "127.0.0.1:$client$i" --peer-addr "127.0.0.1:$peer$i" "${members[@]}" \
    "${security[@]}" --admin-token-file "$ADMIN_TOKEN_FILE" --worker-threads "$THREADS" \
    >>"$WORK/$target$i.log" 2>&1 &
  PID[$target$i]=$!
}

start_etcd() { # member number 1..3
  local i="$1" tls=()
  if [ "$ETCD_TLS" = 1 ]; then
    # No --trusted-ca-file on the client port: in etcd 3.4 it makes every client
    # present a certificate (client authentication, which is not measured here).
    tls=(--cert-file "$CERTS/node-1$i.pem" --key-file "$CERTS/node-1$i.key"
      --peer-cert-file "$CERTS/node-1$i.pem" --peer-key-file "$CERTS/node-1$i.key"
      --peer-trusted-ca-file "$CA_FILE" --peer-client-cert-auth)
  fi
  local cluster="m1=$ETCD_SCHEME://127.0.0.1:7441,m2=$ETCD_SCHEME://127.0.0.1:7442,m3=$ETCD_SCHEME://127.0.0.1:7443"
  GOMAXPROCS="$THREADS" etcd --name "m$i" --data-dir "$WORK/etcd$i" \
    --listen-client-urls "$ETCD_SCHEME://127.0.0.1:743$i" --advertise-client-urls "$ETCD_SCHEME://127.0.0.1:743$i" \
    --listen-peer-urls "$ETCD_SCHEME://127.0.0.1:744$i" --initial-advertise-peer-urls "$ETCD_SCHEME://127.0.0.1:744$i" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token leasehold-bench \
    "${tls[@]}" --logger zap --log-level warn >>"$WORK/etcd$i.log" 2>&1 &
  PID[etcd$i]=$!
}

start_redis() {
  mkdir -p "$WORK/redis"
  redis-server --bind 127.0.0.1 --port 7451 --dir "$WORK/redis" --appendonly yes --appendfsync always \
    --save "" --daemonize no >>"$WORK/redis.log" 2>&1 &
  PID[redis]=$!
}

# Member $2 of target $1.
start_member() {
  case "$1" in
    leasehold|leasehold-plaintext) start_leasehold "$1" "$2" ;;
    etcd) start_etcd "$2" ;;
  esac
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

# Runs a command as a client of Leasehold target $1 with the credential $2 (admin or
# tenant): over TLS trusting the run's CA, or in plaintext for leasehold-plaintext.
as_leasehold() {
  local target="$1" role="$2" transport=(LEASEHOLD_CA_FILE="$CA_FILE") credential
  shift 2
  [ "$target" = leasehold-plaintext ] && transport=(LEASEHOLD_INSECURE_PLAINTEXT=1)
  case "$role" in
    admin) credential=(LEASEHOLD_ADMIN_TOKEN_FILE="$ADMIN_TOKEN_FILE") ;;
    tenant) credential=(LEASEHOLD_TOKEN_FILE="$(tenant_token_file "$target" "${TEAM:-bench}")") ;;
  esac
  env LEASEHOLD_ENDPOINTS="$(endpoints_of "$target")" "${transport[@]}" "${credential[@]}" "$@"
}

leasehold_ready() { # target
  local status
  status="$(as_leasehold "$1" admin "$CLI" status --json)" || return 1
  grep -q '"state":"leader"' <<<"$status" && ! grep -q '"reachable":false' <<<"$status"
}
etcd_ready() {
  local tls=()
  [ "$ETCD_TLS" = 1 ] && tls=(--cacert "$CA_FILE")
  ETCDCTL_API=3 etcdctl --endpoints "$(etcd_urls)" "${tls[@]}" --command-timeout=2s endpoint health
}
redis_ready() { redis-cli -p 7451 ping | grep -q PONG; }
ready() { # target
  case "$1" in
    leasehold|leasehold-plaintext) leasehold_ready "$1" ;;
    *) "${1}_ready" ;;
  esac
}

# The tenant $2 (default `bench`) of Leasehold target $1, with quotas no workload
# reaches, added with the admin credential; the benchmark's clients act as it (the
# teams of noisy-neighbour as `quiet` and `noisy`).
add_bench_tenant() {
  local name="${2:-bench}"
  as_leasehold "$1" admin "$BENCH" add-tenant --endpoints "$(endpoints_of "$1")" --name "$name" \
    --admin-token-file "$ADMIN_TOKEN_FILE" --token-file "$(tenant_token_file "$1" "$name")" \
    --max-sessions 1000000 --max-holds 10000000 --max-waiters 10000000 >/dev/null
}

# Whether process $1 runs (a killed child stays a zombie until it is waited for).
alive() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ "$state" != Z* ]]
}

# Starts again, on the same data, every member of target $1 whose process is gone
# (the failover workload kills a leader).
revive() {
  local target="$1"
  for i in 1 2 3; do
    if ! alive "${PID[$target$i]}"; then
      wait "${PID[$target$i]}" 2>/dev/null || true
      start_member "$target" "$i"
    fi
  done
  wait_until "$target to be healthy" 60 ready "$target"
}

pids_of() {
  case "$1" in
    leasehold|leasehold-plaintext|etcd) echo "${PID[${1}1]},${PID[${1}2]},${PID[${1}3]}" ;;
    redis) echo "${PID[redis]}" ;;
  esac
}

endpoints_of() {
  case "$1" in
    leasehold|leasehold-plaintext)
      local client="${CLIENT_PORTS[$1]}"
      echo "127.0.0.1:${client}1,127.0.0.1:${client}2,127.0.0.1:${client}3"
      ;;
    etcd) echo "$ETCD_ENDPOINTS" ;;
    redis) echo "$REDIS_ENDPOINT" ;;
  esac
}

etcd_urls() { sed "s|127.0.0.1|$ETCD_SCHEME://127.0.0.1|g" <<<"$ETCD_ENDPOINTS"; }

# Whether workload $2 means something on target $1.
measured() {
  case "$1:$2" in
    etcd:semaphore|redis:semaphore|redis:failover|redis:noisy-neighbour) return 1 ;;
    *) return 0 ;;
  esac
}

# One `leasehold-bench run` against target $1 (further arguments passed on): Leasehold
# as its tenant, over TLS or not; etcd over TLS trusting the run's CA (unless
# --etcd-plaintext). The JSON line records the transport, so that summarize keeps
# leasehold and leasehold-plaintext apart.
bench_run() {
  local target="$1"
  shift
  case "$target" in
    leasehold|leasehold-plaintext)
      as_leasehold "$target" tenant "$BENCH" run --target leasehold --endpoints "$(endpoints_of "$target")" "$@"
      ;;
    etcd)
      local tls=()
      [ "$ETCD_TLS" = 1 ] && tls=(--etcd-ca-file "$CA_FILE")
      "$BENCH" run --target etcd --endpoints "$ETCD_ENDPOINTS" "${tls[@]}" "$@"
      ;;
    redis) "$BENCH" run --target redis --endpoints "$REDIS_ENDPOINT" "$@" ;;
  esac
}

IFS=, read -r -a workloads <<<"$WORKLOADS"
# A port already taken would have a member exit at once and the benchmark measure
# whatever else answers there.
for port in 7411 7412 7413 7421 7422 7423 7461 7462 7463 7471 7472 7473 \
  7431 7432 7433 7441 7442 7443 7451; do
  if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    echo "compare.sh: port 127.0.0.1:$port is already in use (another compare.sh run?)" >&2
    exit 1
  fi
done
for target in "${targets[@]}"; do
  case "$target" in
    leasehold|leasehold-plaintext|etcd) for i in 1 2 3; do start_member "$target" "$i"; done ;;
    redis) start_redis ;;
  esac
done
for target in "${targets[@]}"; do
  wait_until "$target to be healthy" 60 ready "$target"
  case "$target" in
    leasehold|leasehold-plaintext)
      for tenant in bench quiet noisy; do
        add_bench_tenant "$target" "$tenant" ||
          { echo "compare.sh: could not add the tenant $tenant to $target" >&2; exit 1; }
      done
      ;;
  esac
done

echo "compare.sh: $(nproc) cores, $(uname -r), etcd $(etcd --version | head -1 | awk '{print $3}'), $(redis-server --version | awk '{print $3}'); data under $WORK"
echo "compare.sh: $ROUNDS rounds of $DURATION after a $WARMUP warm-up; $CLIENTS clients ($CONTENDED_CLIENTS contended, $KEEPALIVE_CLIENTS keepalive); $THREADS thread(s) per Leasehold node and etcd member"
echo "compare.sh: leasehold: TLS (mutual between nodes) + a tenant's bearer token per request; leasehold-plaintext: the same token, no TLS; etcd: $([ "$ETCD_TLS" = 1 ] && echo "TLS (mutual between members), no authentication" || echo "plaintext, no authentication"); redis: plaintext"
LINES="$WORK/results.jsonl"
: >"$LINES"
TEAM_LINES="$WORK/teams.jsonl"
: >"$TEAM_LINES"

# One team's lock-cycle run on target $1 for noisy-neighbour: team $2 (quiet or noisy),
# run label $3, clients $4; its JSON line, labelled, appended to the teams' results.
team_run() {
  local target="$1" team="$2" run="$3" clients="$4"
  TEAM="$team" bench_run "$target" --workload lock-cycle --clients "$clients" --name-prefix "$team" \
    --duration "$DURATION" --warmup "$WARMUP" --label "$target|$run|round=$round" |
    grep '^{' >>"$TEAM_LINES" || echo "compare.sh: noisy-neighbour ($run) on $target failed in round $round" >&2
}

# Both teams of noisy-neighbour on target $1: each alone, then both at once.
noisy_neighbour() {
  local target="$1"
  team_run "$target" quiet "quiet alone" "$QUIET_CLIENTS"
  team_run "$target" noisy "noisy alone" "$FLOOD_CLIENTS"
  team_run "$target" quiet "quiet beside noisy" "$QUIET_CLIENTS" &
  local quiet=$!
  team_run "$target" noisy "noisy beside quiet" "$FLOOD_CLIENTS"
  wait "$quiet" # not a bare wait: the members are this shell's children too
}
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
      if [ "$workload" = noisy-neighbour ]; then
        echo "== round $round: noisy-neighbour on $target, $QUIET_CLIENTS quiet clients beside $FLOOD_CLIENTS"
        noisy_neighbour "$target"
        continue
      fi
      echo "== round $round: $workload on $target, $clients clients"
      bench_run "$target" --workload "$workload" --clients "$clients" \
        --duration "$DURATION" --warmup "$WARMUP" \
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
if [ -s "$LINES" ]; then "$BENCH" summarize "$LINES"; fi
if [ -s "$TEAM_LINES" ]; then
  echo
  echo "noisy-neighbour: team quiet ($QUIET_CLIENTS clients) beside team noisy ($FLOOD_CLIENTS clients), lock-cycle, medians:"
  python3 - "$TEAM_LINES" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    report = json.loads(line)
    target, run, _ = report["label"].split("|")
    runs.setdefault((target, run), []).append(report)
def median(target, run, key):
    values = [r[key] for r in runs.get((target, run), []) if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")
print("| system | quiet alone ops/s | p99 ms | quiet beside flood ops/s | p99 ms | quiet throughput | quiet p99 | flood beside quiet |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for target in sorted({target for target, _ in runs}):
    alone, beside = median(target, "quiet alone", "operations_per_s"), median(target, "quiet beside noisy", "operations_per_s")
    p99_alone, p99_beside = median(target, "quiet alone", "p99_ms"), median(target, "quiet beside noisy", "p99_ms")
    flood = median(target, "noisy beside quiet", "operations_per_s") / median(target, "noisy alone", "operations_per_s")
    print(f"| {target} | {alone:,.0f} | {p99_alone:.1f} | {beside:,.0f} | {p99_beside:.1f} | "
          f"{beside / alone:.2f}x | {p99_beside / p99_alone:.2f}x | {flood:.2f}x |")
EOF
fi
if [ -n "$RESULTS" ]; then
  cat "$LINES" "$TEAM_LINES" >"$RESULTS"
  echo "compare.sh: raw results in $RESULTS"
fi
