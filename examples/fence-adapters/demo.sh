#!/usr/bin/env bash
# The paused-worker story once per store, through the fenced-write adapters
# (leasehold::fence::{postgres, sqlite, mysql, redis, etcd, s3, http}), with real processes:
#
#   worker A takes demo/fence/<store>/<random> (TTL 2 s) and is paused (SIGSTOP) for
#   5 s between taking the lock and writing; worker B is granted the lock once A's
#   session expired and writes `B`; A is resumed, still believing it holds the lock,
#   and writes `A` with its older token.
#
# Prints one line per store. With the fence every stale write must be refused by the
# store itself; with --no-fencing (the control: the same rows or keys written without
# the token check) every stale write must land. Exits 0 when every store behaved as
# expected for the mode, else 1, naming the stores that did not.
#
# Stores: scripts/stores.sh instance 0 of postgres, mariadb, redis, etcd and s3 (started
# if not running, and then stopped at exit); SQLite is a file in a temporary
# directory; `http` is the fenced key-value service (leasehold::fence::http) over
# another SQLite file, served by `leasehold-fence-demo serve`. The cluster is a
# running ./cluster.sh cluster, else one started here (and stopped at exit); the
# workers act as its tenant `demo` over TLS. Stops, by process id, only what it
# started, and deletes the rows and keys it wrote.
#
#   examples/fence-adapters/demo.sh [--no-fencing]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"

CLI="$LEASEHOLD_BIN/leasehold"
DEMO="$LEASEHOLD_BIN/leasehold-fence-demo"
STORES_SH="$LEASEHOLD_ROOT/scripts/stores.sh"
ENDPOINTS="127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103" # cluster.sh's
STORES=(postgres sqlite mariadb redis etcd s3 http)
SERVERS=(postgres mariadb redis etcd s3) # scripts/stores.sh's, instance 0
TTL=2s
PAUSE_S=5
LINE_DEADLINE_S=30
EXIT_DEADLINE_S=30

usage() {
  echo "usage: $0 [--no-fencing]" >&2
  exit 2
}

fencing=1
case $# in
  0) ;;
  1) if [ "$1" = --no-fencing ]; then fencing=0; else usage; fi ;;
  *) usage ;;
esac
no_fencing=()
[ "$fencing" = 1 ] || no_fencing=(--no-fencing)

WORK=$(mktemp -d -t leasehold-fence-demo.XXXXXX)
children=()
started_servers=()
started_cluster=0
forget=() # "store<TAB>url<TAB>resource" of the rows and keys written in shared stores
serve_pid=

die() { echo "demo.sh: $*" >&2; exit 1; }

alive() { kill -0 "$1" 2>/dev/null; }

cleanup() {
  local pid entry store url resource deadline
  set +e
  for pid in "${children[@]}"; do
    if alive "$pid"; then
      kill -CONT "$pid" 2>/dev/null
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null # reaped quietly
    fi
  done
  if [ -n "$serve_pid" ] && alive "$serve_pid"; then
    kill -TERM "$serve_pid" 2>/dev/null # it stops serving and exits
    deadline=$((SECONDS + 5))
    while alive "$serve_pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    alive "$serve_pid" && kill -KILL "$serve_pid" 2>/dev/null
  fi
  for entry in "${forget[@]}"; do
    IFS=$'\t' read -r store url resource <<<"$entry"
    timeout 10 "$DEMO" forget --store "$store" --url "$url" --resource "$resource" >/dev/null 2>&1 ||
      echo "demo.sh: could not delete $resource from $store" >&2
  done
  for store in "${started_servers[@]}"; do
    "$STORES_SH" stop "$store" 0 >/dev/null || echo "demo.sh: could not stop $store-0" >&2
  done
  if [ "$started_cluster" = 1 ]; then
    "$LEASEHOLD_ROOT/cluster.sh" stop >/dev/null || echo "demo.sh: could not stop the cluster" >&2
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- build, stores, cluster ---------------------------------------------------------

if [ ! -x "$DEMO" ] || [ ! -x "$CLI" ] ||
  [ -n "$(find "$LEASEHOLD_ROOT"/{server,client,proto,examples/fence-adapters/src,examples/fence-adapters/Cargo.toml} \
    "$LEASEHOLD_ROOT/Cargo.lock" -newer "$DEMO" -print -quit 2>/dev/null)" ]; then
  "$LEASEHOLD_ROOT/scripts/setup.sh"
  echo "demo.sh: building (release; the first build compiles RocksDB and takes about 25 minutes on 2 cores)…"
  # shellcheck disable=SC2119 # no extra cargo flags
  leasehold_build
fi

declare -A url
found=()
for store in "${SERVERS[@]}"; do
  if "$STORES_SH" status "$store" 0 >/dev/null 2>&1; then
    found+=("$store-0 (running)")
  else
    started_servers+=("$store")
    "$STORES_SH" start "$store" 0 >"$WORK/start-$store.log" 2>&1 ||
      { cat "$WORK/start-$store.log" >&2; die "$store-0 did not start"; }
    found+=("$store-0 (started)")
  fi
  url[$store]=$("$STORES_SH" url "$store" 0)
done
url[sqlite]="$WORK/sqlite.db"

# wait_line FILE PATTERN REASON [PID]: the first line of FILE matching PATTERN; fails
# after LINE_DEADLINE_S, or as soon as PID exited without writing it.
wait_line() {
  local file=$1 pattern=$2 reason=$3 pid=${4:-} deadline=$((SECONDS + LINE_DEADLINE_S)) line
  while :; do
    if line=$(grep -m 1 -E "$pattern" "$file" 2>/dev/null); then
      echo "$line"
      return 0
    fi
    if [ -n "$pid" ] && ! alive "$pid"; then
      # It may have written the line just before it exited.
      line=$(grep -m 1 -E "$pattern" "$file" 2>/dev/null) && { echo "$line"; return 0; }
      echo "demo.sh: exited before $reason" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "demo.sh: timed out after ${LINE_DEADLINE_S}s waiting for $reason" >&2
      return 1
    fi
    sleep 0.05
  done
}

"$DEMO" serve --sqlite "$WORK/http-service.db" </dev/null >"$WORK/serve.out" 2>"$WORK/serve.err" &
serve_pid=$!
if ! fenced_url=$(wait_line "$WORK/serve.out" '^fenced ' "the HTTP service to listen" "$serve_pid") ||
  ! unfenced_url=$(wait_line "$WORK/serve.out" '^unfenced ' "the HTTP service to listen" "$serve_pid"); then
  cat "$WORK/serve.err" >&2
  die "the HTTP service did not start"
fi
if [ "$fencing" = 1 ]; then url[http]=${fenced_url#fenced }; else url[http]=${unfenced_url#unfenced }; fi

# The workers act as cluster.sh's tenant `demo`, over TLS: `cluster.sh env` names the
# CA and the tenant's token.
cluster_is_up() {
  local exports
  exports=$("$LEASEHOLD_ROOT/cluster.sh" env 2>/dev/null) || return 1
  (eval "$exports" && "$CLI" --endpoints "$ENDPOINTS" status >/dev/null 2>&1)
}
if cluster_is_up; then
  cluster="the running cluster at $ENDPOINTS"
else
  started_cluster=1
  "$LEASEHOLD_ROOT/cluster.sh" start >"$WORK/cluster-start.log" 2>&1 ||
    { cat "$WORK/cluster-start.log" >&2; die "the cluster did not start"; }
  cluster="a 3-node cluster started at $ENDPOINTS (TLS, tenant demo)"
fi
eval "$("$LEASEHOLD_ROOT/cluster.sh" env)"
export LEASEHOLD_ENDPOINTS="$ENDPOINTS"

echo "Leasehold: $cluster"
echo "stores: ${found[*]}; sqlite and http (the fenced key-value service, $DEMO serve) over files in $WORK"
if [ "$fencing" = 1 ]; then
  echo "mode: fenced (leasehold::fence::*: each write carries the grant's token, once per grant)"
else
  echo "mode: --no-fencing (the control: the same rows and keys, written without the token check)"
fi
echo "story: A takes the lock (TTL $TTL) and is paused ${PAUSE_S}s before writing; B is granted it after A's session expired and writes B; A wakes and writes A"
echo

# ---- the story, once per store ------------------------------------------------------

declare -A worker_pid worker_stdin

# start_worker NAME STORE RESOURCE VALUE: stdin is a FIFO kept open here, so the
# go-ahead can be given with a line.
start_worker() {
  local name=$1 store=$2 resource=$3 value=$4 fd
  mkfifo "$WORK/$name.in"
  "$DEMO" worker --store "$store" --url "${url[$store]}" --lock "$resource" --resource "$resource" \
    --value "$value" --ttl "$TTL" "${no_fencing[@]}" \
    <"$WORK/$name.in" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  worker_pid[$name]=$!
  children+=($!)
  exec {fd}>"$WORK/$name.in"
  worker_stdin[$name]=$fd
}

go() { echo go >&"${worker_stdin[$1]}"; }

close_stdin() {
  local fd=${worker_stdin[$1]:-}
  [ -z "$fd" ] || exec {fd}>&-
  unset "worker_stdin[$1]"
}

# line NAME PATTERN REASON: wait_line on NAME's output.
line() { wait_line "$WORK/$1.out" "$2" "$3" "${worker_pid[$1]}"; }

# finish NAME: waits (with a deadline) for NAME to exit, then closes its stdin; kills
# it if it is still there. Fails unless it exited 0.
finish() {
  local name=$1 pid=${worker_pid[$1]} code=0 deadline=$((SECONDS + EXIT_DEADLINE_S))
  while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  if alive "$pid"; then
    echo "demo.sh: $name did not exit within ${EXIT_DEADLINE_S}s; killing it" >&2
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || code=$?
  close_stdin "$name"
  if [ "$code" != 0 ]; then
    echo "demo.sh: $name exited $code" >&2
    return 1
  fi
}

# failed STORE REASON NAME…: the store's line for a run that broke, with the workers'
# last error lines; kills those workers (by process id) if they still run.
failed() {
  local store=$1 reason=$2 name pid
  shift 2
  printf '%-10s FAILED: %s\n' "$store" "$reason"
  for name in "$@"; do
    if [ -s "$WORK/$name.err" ]; then
      tail -n 3 "$WORK/$name.err" | sed "s/^/           $name: /"
    fi
    pid=${worker_pid[$name]:-}
    if [ -n "$pid" ] && alive "$pid"; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
    [ -z "$pid" ] || wait "$pid" 2>/dev/null || true
    close_stdin "$name"
  done
  return 1
}

# story STORE: prints the store's line; fails unless the store behaved as expected.
story() {
  local store=$1 resource a b pause_pid acquired_a acquired_b token_a token_b wrote_b wrote_a read_a
  resource="demo/fence/$store/$(od -An -N4 -tx4 /dev/urandom | tr -d ' \n')"
  a="$store-A" b="$store-B"
  case $store in sqlite | http) ;; *) forget+=("$store"$'\t'"${url[$store]}"$'\t'"$resource") ;; esac

  start_worker "$a" "$store" "$resource" A
  acquired_a=$(line "$a" '^acquired ' "A to acquire $resource") || { failed "$store" "A did not take the lock" "$a" "$b"; return; }
  token_a=${acquired_a#acquired }
  kill -STOP "${worker_pid[$a]}"
  sleep "$PAUSE_S" & # A's pause: the story, not a synchronisation
  pause_pid=$!
  children+=("$pause_pid")

  start_worker "$b" "$store" "$resource" B
  acquired_b=$(line "$b" '^acquired ' "B to acquire $resource once A's session expired") ||
    { failed "$store" "B was not granted the lock" "$a" "$b"; return; }
  token_b=${acquired_b#acquired }
  go "$b"
  wrote_b=$(line "$b" '^write ' "B's write") || { failed "$store" "B did not write" "$a" "$b"; return; }
  [ "$wrote_b" = "write accepted" ] || { failed "$store" "B (token $token_b): $wrote_b" "$a" "$b"; return; }
  finish "$b" || { failed "$store" "B failed" "$a" "$b"; return; }

  wait "$pause_pid" || true
  kill -CONT "${worker_pid[$a]}"
  go "$a"
  wrote_a=$(line "$a" '^write ' "A's late write") || { failed "$store" "A did not write" "$a" "$b"; return; }
  read_a=$(line "$a" '^value ' "A's read") || { failed "$store" "A did not read back" "$a" "$b"; return; }
  finish "$a" || { failed "$store" "A failed" "$a" "$b"; return; }

  if [ "$wrote_a" = "write refused $token_b" ] && [ "$read_a" = "value $token_b B" ] && [ "$token_a" -lt "$token_b" ]; then
    printf '%-10s stale write refused: A (token %s) < B (token %s); the store holds B\n' "$store" "$token_a" "$token_b"
    [ "$fencing" = 1 ]
  elif [ "$wrote_a" = "write accepted" ] && [ "$read_a" = "value $token_a A" ] && [ "$token_a" -lt "$token_b" ]; then
    printf '%-10s stale write LANDED: A (token %s) overwrote B (token %s)\n' "$store" "$token_a" "$token_b"
    [ "$fencing" = 0 ]
  else
    printf '%-10s UNEXPECTED: A (token %s) after B (token %s): %s; read back: %s\n' \
      "$store" "$token_a" "$token_b" "$wrote_a" "$read_a"
    return 1
  fi
}

wrong=()
for store in "${STORES[@]}"; do
  story "$store" || wrong+=("$store")
done

echo
if [ "${#wrong[@]}" -gt 0 ]; then
  if [ "$fencing" = 1 ]; then
    die "not every stale write was refused: ${wrong[*]}"
  else
    die "not every stale write landed without the fence: ${wrong[*]}"
  fi
fi
if [ "$fencing" = 1 ]; then
  echo "Every store refused the paused worker's stale write itself: the lock had passed to B, and only the token check in the store could stop A."
else
  echo "Without the token check every store took the paused worker's stale write over B's: the lock alone cannot stop it (run without --no-fencing for the fence)."
fi
