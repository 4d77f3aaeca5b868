#!/usr/bin/env bash
# The double-charge and triple-email stories, end to end, with real processes:
#
#   1. worker A takes orders/42 (TTL 2 s) and is paused 5 s; worker B takes over and
#      charges; A wakes up and tries to charge — with the fence, and without it;
#   2. worker A is killed (SIGKILL) after the provider charged, before its own write
#      committed; worker B completes the order after A's TTL;
#   3. a charge retried with the same Idempotency-Key, then the key reused with
#      another amount;
#   4. three report pods start together, three weeks running, each as
#      `leasehold lock --try weekly-report -- leasehold-payments send-report …`.
#
# Then prints the report: charges per order, stale writes the fence rejected, emails
# per user. Uses a running `scripts/postgres.sh` instance or starts a private
# PostgreSQL (127.0.0.1, a free port, a temporary data directory); uses a running
# ./cluster.sh cluster or starts one. Stops, by process id, only what it started.
#
#   examples/payments/demo.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"

CLI="$LEASEHOLD_BIN/leasehold"
PAYMENTS="$LEASEHOLD_BIN/leasehold-payments"
ENDPOINTS="127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103" # cluster.sh's
TTL=2s
PAUSE_S=5
LINE_DEADLINE_S=30
USERS=20
WEEKS=3

WORK=$(mktemp -d -t leasehold-payments-demo.XXXXXX)
chmod 755 "$WORK" # the postgres user reaches its data directory below it
children=()
started_cluster=0
started_postgres=0
postgres_env=()

die() { echo "demo.sh: $*" >&2; exit 1; }

cleanup() {
  local pid
  for pid in "${children[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [ "$started_postgres" = 1 ]; then
    env "${postgres_env[@]}" "$LEASEHOLD_ROOT/scripts/postgres.sh" stop >/dev/null || true
  elif [ -n "${ADMIN_URL:-}" ]; then
    for database in leasehold_demo_fenced leasehold_demo_unfenced; do
      psql "$ADMIN_URL" -qX -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" >/dev/null 2>&1 || true
    done
  fi
  if [ "$started_cluster" = 1 ]; then
    "$LEASEHOLD_ROOT/cluster.sh" stop >/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- build, PostgreSQL, cluster -----------------------------------------------------

if [ ! -x "$PAYMENTS" ] || [ ! -x "$CLI" ] ||
  [ -n "$(find "$LEASEHOLD_ROOT"/{server,client,proto,examples/payments} "$LEASEHOLD_ROOT/Cargo.lock" -newer "$PAYMENTS" -print -quit 2>/dev/null)" ]; then
  "$LEASEHOLD_ROOT/scripts/setup.sh"
  echo "demo.sh: building (release; the first build compiles RocksDB and takes about 25 minutes on 2 cores)…"
  leasehold_build
fi

if "$LEASEHOLD_ROOT/scripts/postgres.sh" status >/dev/null 2>&1; then
  ADMIN_URL=$("$LEASEHOLD_ROOT/scripts/postgres.sh" url)
  echo "PostgreSQL: the running scripts/postgres.sh instance ($ADMIN_URL)"
else
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  postgres_env=(LEASEHOLD_POSTGRES_DIR="$WORK/postgres" LEASEHOLD_POSTGRES_PORT="$port")
  started_postgres=1
  env "${postgres_env[@]}" "$LEASEHOLD_ROOT/scripts/postgres.sh" start
  ADMIN_URL=$(env "${postgres_env[@]}" "$LEASEHOLD_ROOT/scripts/postgres.sh" url)
fi
FENCED_URL="${ADMIN_URL%/*}/leasehold_demo_fenced"
UNFENCED_URL="${ADMIN_URL%/*}/leasehold_demo_unfenced"
for database in leasehold_demo_fenced leasehold_demo_unfenced; do
  PGOPTIONS="-c client_min_messages=warning" psql "$ADMIN_URL" -qX -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" -c "CREATE DATABASE $database" >/dev/null
done
"$PAYMENTS" --database-url "$FENCED_URL" setup --order-ids 42,43 --users "$USERS"
"$PAYMENTS" --database-url "$UNFENCED_URL" setup --order-ids 42

# The workers act as cluster.sh's tenant `demo`, over TLS: `cluster.sh env` names the
# CA, the tenant's token and the admin token.
cluster_is_up() {
  local exports
  exports=$("$LEASEHOLD_ROOT/cluster.sh" env 2>/dev/null) || return 1
  (eval "$exports" && "$CLI" --endpoints "$ENDPOINTS" status >/dev/null 2>&1)
}
if cluster_is_up; then
  echo "Leasehold: the running cluster at $ENDPOINTS"
else
  started_cluster=1
  "$LEASEHOLD_ROOT/cluster.sh" start >"$WORK/cluster-start.log" 2>&1 ||
    { cat "$WORK/cluster-start.log" >&2; die "the cluster did not start"; }
  echo "Leasehold: started a 3-node cluster at $ENDPOINTS (TLS, tenant demo)"
fi
eval "$("$LEASEHOLD_ROOT/cluster.sh" env)"
export LEASEHOLD_ENDPOINTS="$ENDPOINTS"

# ---- workers ------------------------------------------------------------------------

declare -A worker_pid worker_stdin

# start_worker NAME DATABASE_URL ORDER_ID [worker flags…]: stdin is a FIFO kept open
# here, so a `--pause-at` can be released with a line.
start_worker() {
  local name=$1 url=$2 order_id=$3 fd
  shift 3
  mkfifo "$WORK/$name.in"
  "$PAYMENTS" --database-url "$url" worker --order-id "$order_id" --name "$name" "$@" \
    <"$WORK/$name.in" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  worker_pid[$name]=$!
  children+=($!)
  exec {fd}>"$WORK/$name.in"
  worker_stdin[$name]=$fd
}

# wait_line NAME PATTERN REASON: the first line of NAME's output matching PATTERN.
wait_line() {
  local name=$1 pattern=$2 reason=$3 deadline=$((SECONDS + LINE_DEADLINE_S)) line
  while [ $SECONDS -lt $deadline ]; do
    if line=$(grep -m 1 -E "$pattern" "$WORK/$name.out"); then
      echo "$line"
      return 0
    fi
    sleep 0.05
  done
  cat "$WORK/$name.err" >&2
  die "timed out after ${LINE_DEADLINE_S}s waiting for $reason"
}

go() { echo go >&"${worker_stdin[$1]}"; }

# wait_exit NAME: NAME's exit code.
wait_exit() {
  local code=0
  wait "${worker_pid[$1]}" || code=$?
  echo "$code"
}

paused_story() {
  local label=$1 url=$2 flags=("${@:3}") a b token_a token_b late
  a="$label-A" b="$label-B"
  start_worker "$a" "$url" 42 --ttl "$TTL" --pause-at acquired "${flags[@]}"
  token_a=$(wait_line "$a" '^acquired ' "A to acquire orders/42" | cut -d' ' -f2)
  wait_line "$a" '^paused at acquired' "A to stop before charging" >/dev/null
  kill -STOP "${worker_pid[$a]}"
  echo "  worker A holds orders/42 with token $token_a (TTL $TTL) and stalls: SIGSTOP for ${PAUSE_S}s"
  start_worker "$b" "$url" 42 --ttl "$TTL" "${flags[@]}"
  token_b=$(wait_line "$b" '^acquired ' "B to acquire orders/42 after A's session expired" | cut -d' ' -f2)
  echo "  worker B is granted orders/42 once A's session expired: token $token_b"
  echo "  worker B: $(wait_line "$b" '^(charged|superseded) ' "B's charge")"
  sleep "$PAUSE_S" # A's pause: the scenario, not a synchronisation
  kill -CONT "${worker_pid[$a]}"
  go "$a"
  late=$(wait_line "$a" '^(charged|superseded) ' "A's late charge")
  echo "  worker A wakes up, still believing it holds the lock: $late (exit $(wait_exit "$a"))"
  case $late in
    superseded*) echo "  -> A's conditional UPDATE matched 0 rows: the row carries B's newer token" ;;
    *) echo "  -> A's UPDATE overwrote B's row with its older token; only the provider's idempotency key kept the card from a second charge" ;;
  esac
  wait_exit "$b" >/dev/null
}

echo
echo "== 1a. a worker paused past its lease, with the fence (leasehold::fence::postgres::guard: … WHERE token < \$token) =="
paused_story fenced "$FENCED_URL"
echo
echo "== 1b. the same without the fence check (--no-fencing) =="
paused_story unfenced "$UNFENCED_URL" --no-fencing

echo
echo "== 2. a worker killed mid-charge (after the provider charged, before its own commit) =="
start_worker crash-A "$FENCED_URL" 43 --ttl "$TTL" --pause-at provider-charged
token_a=$(wait_line crash-A '^acquired ' "A to acquire orders/43" | cut -d' ' -f2)
wait_line crash-A '^paused at provider-charged' "A to charge at the provider" >/dev/null
start_worker crash-B "$FENCED_URL" 43 --ttl "$TTL" --wait 30s
kill -KILL "${worker_pid[crash-A]}"
killed_at=$SECONDS
wait "${worker_pid[crash-A]}" 2>/dev/null || true # reaped quietly
echo "  worker A (token $token_a): the provider charged order 43, then A was killed with SIGKILL"
token_b=$(wait_line crash-B '^acquired ' "B to acquire orders/43" | cut -d' ' -f2)
echo "  worker B is granted orders/43 after A's TTL ran out (about $((SECONDS - killed_at)) s): token $token_b"
echo "  worker B: $(wait_line crash-B '^(charged|superseded) ' "B's charge")  <- the provider's stored response"
wait_exit crash-B >/dev/null

echo
echo "== 3. a charge with an Idempotency-Key, retried, then the key reused for another amount =="
for amount in 1999 1999 2999; do
  code=0
  response=$("$PAYMENTS" --database-url "$FENCED_URL" charge --key checkout-7f3a --order-id 500 \
    --amount-cents "$amount" 2>"$WORK/charge.err") || code=$?
  echo "  charge --key checkout-7f3a --amount-cents $amount -> exit $code ${response:-} ($(tail -n 1 "$WORK/charge.err" | sed 's/^leasehold-payments: //'))"
done

echo
echo "== 4. three report pods start together, $WEEKS weeks running =="
export LEASEHOLD_PAYMENTS_DATABASE_URL="$FENCED_URL"
for week in $(seq 1 "$WEEKS"); do
  campaign="2025-W0$week"
  pods=()
  for pod in 1 2 3; do
    "$CLI" lock weekly-report --try --ttl 10s -- \
      "$PAYMENTS" send-report --campaign "$campaign" --pod "pod-$pod" --hold-ms 1000 \
      >"$WORK/$campaign-pod-$pod.out" 2>&1 &
    pods+=($!)
    children+=($!)
  done
  ran=() skipped=()
  for pod in 1 2 3; do
    code=0
    wait "${pods[$((pod - 1))]}" || code=$?
    case $code in
      0) ran+=("pod-$pod") ;;
      75) skipped+=("pod-$pod") ;;
      *) cat "$WORK/$campaign-pod-$pod.out" >&2; die "pod-$pod exited $code" ;;
    esac
  done
  echo "  $campaign: ran in ${ran[*]:-no pod}; skipped (exit 75): ${skipped[*]:-none}"
done

echo
echo "== report: with the fence =="
"$PAYMENTS" --database-url "$FENCED_URL" summary
echo
echo "== report: without the fence check =="
"$PAYMENTS" --database-url "$UNFENCED_URL" summary
echo
echo "The lock gave each job one holder at a time, in token order. It could not stop"
echo "the paused worker from writing: the fence column did (1a), and without it the"
echo "stale write landed (1b). The provider's idempotency key kept the crashed worker's"
echo "charge from happening twice (2, 3); the UNIQUE key kept one email per user (4)."
