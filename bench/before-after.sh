#!/usr/bin/env bash
# The cost of a change, in the same run: this checkout's leasehold-server ("after")
# against another build of it ("before", e.g. one built from the commit before the
# change), each as a 3-node cluster run as production runs it (TLS on both ports,
# an admin token, the tenant `bench`), the workloads alternating which cluster goes
# first from round to round. Prints each side's medians (`leasehold-bench
# summarize`); the after/before ratios go into bench/README.md.
#
#   bench/before-after.sh --before PATH/leasehold-server [--rounds 3] [--duration 10s]
#                         [--warmup 2s] [--clients 64] [--contended-clients 16]
#                         [--keepalive-clients 64] [--workloads lock-cycle,contended,keepalive]
#                         [--lock-delay 5s] [--status-page] [--keep]
#
# --after-arg ARG (repeated) is given to the after side's servers only: with --before
# this checkout's own server, it measures what a setting costs, e.g.
#   bench/before-after.sh --before "$CARGO_TARGET_DIR/release/leasehold-server" --after-arg --watch --after-arg 'bench:*'
#
# --status-page gives the after side's nodes a status page (--status-addr) and keeps
# it open for the whole run: every second one request to each node's /api/status
# with the admin token, as a browser tab with the page open does (a new TLS
# connection each time, where a tab keeps one: the heavier case). With --before this
# checkout's own server, it measures what an open page costs.
#
# --lock-delay adds a third cluster, "delayed": this checkout's server again, whose
# clients acquire every lock and permit with that lock-delay (`leasehold-bench run
# --lock-delay`), so the run also shows what a delay costs a lock cycle.
#
# A "before" binary from an older commit, without rebuilding RocksDB: copy the warm
# target directory and build the commit in a worktree against the copy
#   git worktree add /tmp/before COMMIT
#   cp -a "$CARGO_TARGET_DIR" /tmp/before-target
#   config="$PWD/.cargo/config.toml"   # this checkout's rustflags, or RocksDB compiles again
#   (cd /tmp/before && find . -name '*.rs' -o -name '*.proto' | xargs touch &&
#    CARGO_TARGET_DIR=/tmp/before-target cargo --config "$config" build --release --workspace --all-targets)
# Build the whole workspace, as `leasehold_build` builds this side, so that both
# sides carry the same dependency features: a server built with `-p leasehold-server`
# alone gets others, and measures differently (bench/README.md). The `touch` makes cargo see the older
# sources as changed (the copied target directory is newer than them).
set -euo pipefail

BEFORE=""
ROUNDS=3
DURATION=10s
WARMUP=2s
CLIENTS=64
CONTENDED_CLIENTS=16
KEEPALIVE_CLIENTS=64
WORKLOADS=lock-cycle,contended,keepalive
KEEP=0
LOCK_DELAY=""
AFTER_ARGS=()
STATUS_PAGE=0
THREADS=$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --before) BEFORE="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --contended-clients) CONTENDED_CLIENTS="$2"; shift 2 ;;
    --keepalive-clients) KEEPALIVE_CLIENTS="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --lock-delay) LOCK_DELAY="$2"; shift 2 ;;
    --after-arg) AFTER_ARGS+=("$2"); shift 2 ;;
    --status-page) STATUS_PAGE=1; shift ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "before-after.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BEFORE" ] || { echo "before-after.sh: --before must name a leasehold-server binary" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$LEASEHOLD_ROOT"
unset LEASEHOLD_ENDPOINTS LEASEHOLD_CA_FILE LEASEHOLD_TOKEN_FILE LEASEHOLD_TOKEN LEASEHOLD_CERT_FILE \
  LEASEHOLD_KEY_FILE LEASEHOLD_INSECURE_PLAINTEXT LEASEHOLD_ADMIN_TOKEN_FILE
leasehold_build
BENCH="$LEASEHOLD_BIN/leasehold-bench"
CLI="$LEASEHOLD_BIN/leasehold"
declare -A SERVER=([before]="$BEFORE" [after]="$LEASEHOLD_BIN/leasehold-server" [delayed]="$LEASEHOLD_BIN/leasehold-server")
declare -A CLIENT_PORTS=([before]=781 [after]=791 [delayed]=801)
declare -A PEER_PORTS=([before]=782 [after]=792 [delayed]=802)
STATUS_PORT=793
SIDES=(before after)
[ -n "$LOCK_DELAY" ] && SIDES+=(delayed)

WORK="$(mktemp -d /tmp/leasehold-before-after.XXXXXX)"
declare -A PID=()
cleanup() {
  for name in "${!PID[@]}"; do kill -KILL "${PID[$name]}" 2>/dev/null || true; done
  for name in "${!PID[@]}"; do wait "${PID[$name]}" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ]; then echo "before-after.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CERTS="$WORK/certs"
"$CLI" cert ca "$CERTS" >/dev/null
for i in 1 2 3; do "$CLI" cert node "$CERTS" --id "$i" --host 127.0.0.1 >/dev/null; done
(umask 077 && "$CLI" new-token --prefix admin >"$CERTS/admin.token")

endpoints_of() { local c="${CLIENT_PORTS[$1]}"; echo "127.0.0.1:${c}1,127.0.0.1:${c}2,127.0.0.1:${c}3"; }
pids_of() { echo "${PID[${1}1]},${PID[${1}2]},${PID[${1}3]}"; }
for side in "${SIDES[@]}"; do
  for port in 1 2 3; do
    for prefix in "${CLIENT_PORTS[$side]}" "${PEER_PORTS[$side]}"; do
      if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$prefix$port" 2>/dev/null; then
        echo "before-after.sh: port 127.0.0.1:$prefix$port is already in use" >&2
        exit 1
      fi
    done
  done
  members=()
  for j in 1 2 3; do
    members+=(--initial-member "$j=127.0.0.1:${CLIENT_PORTS[$side]}$j,127.0.0.1:${PEER_PORTS[$side]}$j")
  done
  side_args=()
  [ "$side" = after ] && side_args=("${AFTER_ARGS[@]}")
  for i in 1 2 3; do
    node_args=()
    [ "$side" = after ] && [ "$STATUS_PAGE" = 1 ] && node_args=(--status-addr "127.0.0.1:$STATUS_PORT$i")
    RUST_LOG=warn "${SERVER[$side]}" --node-id "$i" --cluster-name bench --data-dir "$WORK/$side$i" \
      --client-addr "127.0.0.1:${CLIENT_PORTS[$side]}$i" --peer-addr "127.0.0.1:${PEER_PORTS[$side]}$i" \
      "${members[@]}" --tls-cert "$CERTS/node-$i.pem" --tls-key "$CERTS/node-$i.key" \
      --peer-cert "$CERTS/node-$i.pem" --peer-key "$CERTS/node-$i.key" --peer-ca "$CERTS/ca.pem" \
      --admin-token-file "$CERTS/admin.token" --worker-threads "$THREADS" "${side_args[@]}" "${node_args[@]}" \
      >>"$WORK/$side$i.log" 2>&1 &
    PID[$side$i]=$!
  done
done
for side in "${SIDES[@]}"; do
  deadline=$((SECONDS + 60))
  until env LEASEHOLD_ENDPOINTS="$(endpoints_of "$side")" LEASEHOLD_CA_FILE="$CERTS/ca.pem" \
    LEASEHOLD_ADMIN_TOKEN_FILE="$CERTS/admin.token" "$CLI" status --json 2>/dev/null | grep -q '"state":"leader"'; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "before-after.sh: $side did not elect a leader in 60 s" >&2; exit 1; }
    sleep 0.2
  done
  env LEASEHOLD_CA_FILE="$CERTS/ca.pem" "$BENCH" add-tenant --endpoints "$(endpoints_of "$side")" --name bench \
    --admin-token-file "$CERTS/admin.token" --token-file "$CERTS/$side.token" \
    --max-sessions 1000000 --max-holds 10000000 --max-waiters 10000000 >/dev/null
done

if [ "$STATUS_PAGE" = 1 ]; then
  (
    while :; do
      for i in 1 2 3; do
        curl -s -o /dev/null --cacert "$CERTS/ca.pem" -H "Authorization: Bearer $(head -1 "$CERTS/admin.token")" \
          "https://127.0.0.1:$STATUS_PORT$i/api/status" || true
      done
      sleep 1
    done
  ) &
  PID[status_poller]=$!
  curl -sf -o /dev/null --cacert "$CERTS/ca.pem" -H "Authorization: Bearer $(head -1 "$CERTS/admin.token")" \
    "https://127.0.0.1:${STATUS_PORT}1/api/status" ||
    { echo "before-after.sh: the after side's status page does not answer" >&2; exit 1; }
fi
echo "before-after.sh: before = $BEFORE, after = ${SERVER[after]} ${AFTER_ARGS[*]}; $ROUNDS rounds of $DURATION; $THREADS thread(s) per node"
IFS=, read -r -a workloads <<<"$WORKLOADS"
for round in $(seq 1 "$ROUNDS"); do
  # Each round starts with another side, so no side always runs on a cooler machine.
  order=()
  for k in "${!SIDES[@]}"; do order+=("${SIDES[$(((k + round - 1) % ${#SIDES[@]}))]}"); done
  for workload in "${workloads[@]}"; do
    case "$workload" in
      contended) clients="$CONTENDED_CLIENTS" ;;
      keepalive) clients="$KEEPALIVE_CLIENTS" ;;
      *) clients="$CLIENTS" ;;
    esac
    for side in "${order[@]}"; do
      extra=()
      [ "$side" = delayed ] && extra=(--lock-delay "$LOCK_DELAY")
      echo "== round $round: $workload on $side, $clients clients"
      env LEASEHOLD_CA_FILE="$CERTS/ca.pem" LEASEHOLD_TOKEN_FILE="$CERTS/$side.token" \
        "$BENCH" run --target leasehold --endpoints "$(endpoints_of "$side")" --workload "$workload" \
        --clients "$clients" --duration "$DURATION" --warmup "$WARMUP" --pids "$(pids_of "$side")" \
        --label "round=$round" --json-out "$WORK/$side.jsonl" "${extra[@]}" | grep -v '^{' ||
        echo "before-after.sh: $workload on $side failed in round $round" >&2
    done
  done
done
for side in "${SIDES[@]}"; do
  echo
  echo "Medians over $ROUNDS rounds, $side:"
  "$BENCH" summarize "$WORK/$side.jsonl"
done
