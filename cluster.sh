#!/usr/bin/env bash
# A local Leasehold cluster on 127.0.0.1, with TLS on every port and credentials.
#
#   ./cluster.sh start [N]     build if needed, start N nodes (3 by default, 5 allowed),
#                              wait for a leader, add the tenant `demo`, take a fenced lock
#   ./cluster.sh env           the exports a shell needs: eval "$(./cluster.sh env)"
#   ./cluster.sh stop          stop every node (SIGTERM, then SIGKILL)
#   ./cluster.sh status        node processes and `leasehold status`
#   ./cluster.sh kill I        SIGKILL node I
#   ./cluster.sh restart I     start node I again on its data directory (stopping it first)
#   ./cluster.sh pause I       SIGSTOP node I
#   ./cluster.sh resume I      SIGCONT node I
#   ./cluster.sh reload I      SIGHUP node I: it re-reads its certificates and the admin token
#   ./cluster.sh logs I        the last lines of node I's log
#   ./cluster.sh clean         stop and delete the cluster's data and credentials
#
# Ports of node I: client 127.0.0.1:710I, peer 127.0.0.1:720I, metrics
# https://127.0.0.1:730I/metrics (for a scraper with the token in .cluster/scrape.token),
# status page https://127.0.0.1:740I/ (its certificate is from the cluster's own CA:
# a browser warns unless .cluster/certs/ca.pem is imported; it asks for the admin
# token in .cluster/admin.token).
# LEASEHOLD_SERVER_FLAGS adds flags to every node (e.g. "--election-timeout-min-ms 300").
# LEASEHOLD_SERVER=PATH runs that leasehold-server binary instead of this checkout's.
# The nodes share this machine's cores: each gets --worker-threads cores/N (at least
# 1) unless LEASEHOLD_SERVER_FLAGS sets it.
# Credentials, made by the first `start` and kept until `clean`, under .cluster/:
# certs/ (a CA, and node-I.pem for both ports of node I, which accept client
# certificates from the same CA), admin.token (the admin credential), demo.token
# (the token of the tenant `demo`, as which `env` makes the CLI act).
# Data, logs and process ids live under .cluster/ in the checkout. The script acts
# only on the process ids it recorded, never on process names.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/env.sh"

# Absolute, so that the nodes, `restart` and `env` name the same files from any directory.
CLUSTER_DIR="$(realpath -m "${LEASEHOLD_CLUSTER_DIR:-$LEASEHOLD_ROOT/.cluster}")"
CLUSTER_NAME="local"
# LEASEHOLD_SERVER runs another build of the node (a benchmark's "before" side).
SERVER="${LEASEHOLD_SERVER:-$LEASEHOLD_BIN/leasehold-server}"
CLI="$LEASEHOLD_BIN/leasehold"
CERTS_DIR="$CLUSTER_DIR/certs"
CA_FILE="$CERTS_DIR/ca.pem"
ADMIN_TOKEN_FILE="$CLUSTER_DIR/admin.token"
# What a scraper sends to the metrics ports: `Authorization: Bearer <first line>`.
SCRAPE_TOKEN_FILE="$CLUSTER_DIR/scrape.token"
DEMO_TENANT="demo"
DEMO_TOKEN_FILE="$CLUSTER_DIR/$DEMO_TENANT.token"

die() { echo "cluster.sh: $*" >&2; exit 1; }

size() { cat "$CLUSTER_DIR/size" 2>/dev/null || echo 3; }
client_addr() { echo "127.0.0.1:710$1"; }
peer_addr() { echo "127.0.0.1:720$1"; }
metrics_addr() { echo "127.0.0.1:730$1"; }
status_addr() { echo "127.0.0.1:740$1"; }
endpoints() {
  local n list=""
  n=$(size)
  for i in $(seq 1 "$n"); do list="$list${list:+,}$(client_addr "$i")"; done
  echo "$list"
}

# The recorded pid of node I if that process is still our leasehold-server.
live_pid() {
  local file="$CLUSTER_DIR/node$1.pid" pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "leasehold-server[^ /]* .*--node-id $1 " || return 1
  echo "$pid"
}

# The CLI against this cluster. The flags name its files, and the caller's LEASEHOLD_*
# variables (another cluster's, say) are left out, so that nothing else is mixed in.
leasehold_cli() {
  env -u LEASEHOLD_ENDPOINTS -u LEASEHOLD_CA_FILE -u LEASEHOLD_TOKEN_FILE -u LEASEHOLD_TOKEN \
    -u LEASEHOLD_ADMIN_TOKEN_FILE -u LEASEHOLD_CERT_FILE -u LEASEHOLD_KEY_FILE -u LEASEHOLD_INSECURE_PLAINTEXT \
    "$CLI" --endpoints "$(endpoints)" --ca-file "$CA_FILE" "$@"
}
as_admin() { leasehold_cli --admin-token-file "$ADMIN_TOKEN_FILE" "$@"; }
as_demo() { leasehold_cli --token-file "$DEMO_TOKEN_FILE" "$@"; }

check_node() {
  [[ "${1:-}" =~ ^[1-5]$ ]] || die "node number must be 1 to 5, got '${1:-}'"
  [ "$1" -le "$(size)" ] || die "node $1 is not part of this $(size)-node cluster"
}

build() {
  if [ ! -x "$SERVER" ] || [ ! -x "$CLI" ] || [ -n "$(find "$LEASEHOLD_ROOT"/{server,client,proto,jepsen-like-tests} "$LEASEHOLD_ROOT/Cargo.toml" "$LEASEHOLD_ROOT/Cargo.lock" -newer "$SERVER" -print -quit 2>/dev/null)" ]; then
    "$LEASEHOLD_ROOT/scripts/setup.sh"
    echo "cluster.sh: building (release; the first build compiles RocksDB and takes about 25 minutes on 2 cores)…"
    leasehold_build
  fi
}

# The CA, a certificate for each of the $1 nodes and the admin token, each made
# only if missing: a restart keeps them, and `clean` removes them.
make_credentials() {
  local n=$1 i
  mkdir -p "$CERTS_DIR"
  if [ ! -f "$CERTS_DIR/ca.key" ]; then
    # Certificates of another CA would not verify against this one.
    rm -f "$CERTS_DIR"/node-*.pem "$CERTS_DIR"/node-*.key
    "$CLI" cert ca "$CERTS_DIR" >/dev/null
    echo "made a CA: $CA_FILE"
  fi
  for i in $(seq 1 "$n"); do
    if [ ! -f "$CERTS_DIR/node-$i.pem" ] || [ ! -f "$CERTS_DIR/node-$i.key" ]; then
      "$CLI" cert node "$CERTS_DIR" --id "$i" --host 127.0.0.1 --host localhost >/dev/null
      echo "made node $i's certificate: $CERTS_DIR/node-$i.pem (node-$i.leasehold, 127.0.0.1, localhost)"
    fi
  done
  local token file
  for token in admin scrape; do
    file="$CLUSTER_DIR/$token.token"
    if [ ! -s "$file" ]; then
      (umask 077 && "$CLI" new-token --prefix "$token" >"$file.tmp")
      chmod 600 "$file.tmp"
      mv "$file.tmp" "$file"
      echo "made the $token token: $file"
    fi
  done
}

# The tenant `demo` with its token in $DEMO_TOKEN_FILE: added by the first start; a
# later one finds it and keeps its token (or gives it a new one if the file is gone).
ensure_demo_tenant() {
  local tenants
  tenants=$(as_admin tenant list --json) || die "cannot list the tenants; see ./cluster.sh logs 1"
  if python3 -c 'import json,sys; sys.exit(0 if any(t["name"] == sys.argv[1] for t in json.load(sys.stdin)) else 1)' \
    "$DEMO_TENANT" <<<"$tenants"; then
    if [ -s "$DEMO_TOKEN_FILE" ]; then
      echo "tenant $DEMO_TENANT: exists, token in $DEMO_TOKEN_FILE"
    else
      as_admin tenant rotate-token "$DEMO_TENANT" --token-file "$DEMO_TOKEN_FILE" >/dev/null
      echo "tenant $DEMO_TENANT: exists, its token file was missing: gave it a new token in $DEMO_TOKEN_FILE"
    fi
  else
    as_admin tenant add "$DEMO_TENANT" --token-file "$DEMO_TOKEN_FILE" >/dev/null
    echo "tenant $DEMO_TENANT: added, token in $DEMO_TOKEN_FILE"
  fi
}

# Whether something listens on host:port $1.
listening() {
  timeout 1 bash -c "exec 3<>/dev/tcp/${1%:*}/${1##*:}" 2>/dev/null
}

start_node() {
  local i=$1 n members=() pid address
  n=$(size)
  if pid=$(live_pid "$i"); then echo "node $i is already running (pid $pid)"; return 0; fi
  for address in "$(client_addr "$i")" "$(peer_addr "$i")" "$(metrics_addr "$i")" "$(status_addr "$i")"; do
    if listening "$address"; then
      die "node $i cannot start: $address is already in use (another cluster started from another checkout? stop it there with ./cluster.sh stop)"
    fi
  done
  for j in $(seq 1 "$n"); do members+=(--initial-member "$j=$(client_addr "$j"),$(peer_addr "$j")"); done
  # All nodes run on this machine: a share of its cores each, not all of them each.
  local threads=()
  if [[ " ${LEASEHOLD_SERVER_FLAGS:-} " != *" --worker-threads"* ]]; then
    threads=(--worker-threads "$(( $(nproc) / n > 1 ? $(nproc) / n : 1 ))")
  fi
  mkdir -p "$CLUSTER_DIR"
  # The nodes' logs and data name every tenant and hold token hashes: the directory
  # is this user's only.
  chmod 700 "$CLUSTER_DIR"
  # One certificate for both ports: it names node-I.leasehold (what peers check) and
  # 127.0.0.1 (what clients dial). Clients may also authenticate with a tenant
  # certificate from the same CA (`leasehold cert tenant .cluster/certs NAME
  # --token-file NAME.token`).
  local tls=(
    --tls-cert "$CERTS_DIR/node-$i.pem" --tls-key "$CERTS_DIR/node-$i.key" --client-ca "$CA_FILE"
    --peer-cert "$CERTS_DIR/node-$i.pem" --peer-key "$CERTS_DIR/node-$i.key" --peer-ca "$CA_FILE"
    --admin-token-file "$ADMIN_TOKEN_FILE"
  )
  # A build from before the scrape token (a benchmark's "before" side) serves its
  # metrics without one.
  if "$SERVER" --help 2>/dev/null | grep -q -- '--metrics-token-file'; then
    tls+=(--metrics-token-file "$SCRAPE_TOKEN_FILE")
  fi
  setsid "$SERVER" --node-id "$i" --cluster-name "$CLUSTER_NAME" --data-dir "$CLUSTER_DIR/node$i" \
    --metrics-addr "$(metrics_addr "$i")" --status-addr "$(status_addr "$i")" "${members[@]}" "${tls[@]}" "${threads[@]}" ${LEASEHOLD_SERVER_FLAGS:-} \
    >>"$CLUSTER_DIR/node$i.log" 2>&1 </dev/null &
  echo $! >"$CLUSTER_DIR/node$i.pid"
  echo "node $i started (pid $!): client $(client_addr "$i"), peer $(peer_addr "$i"), metrics https://$(metrics_addr "$i")/metrics, status page https://$(status_addr "$i")/"
}

# Waits until node $1 listens on its client address; fails with its last log lines
# if it exits first, or after $2 seconds.
wait_listening() {
  local i=$1 deadline=$((SECONDS + $2))
  until listening "$(client_addr "$i")"; do
    if ! live_pid "$i" >/dev/null; then
      tail -n 5 "$CLUSTER_DIR/node$i.log" >&2
      die "node $i exited while starting (log: $CLUSTER_DIR/node$i.log)"
    fi
    [ $SECONDS -lt "$deadline" ] || die "node $i does not listen on $(client_addr "$i") after $2 s; see ./cluster.sh logs $i"
    sleep 0.1
  done
}

wait_for_leader() {
  local deadline=$((SECONDS + ${1:-20})) leader
  while [ $SECONDS -lt $deadline ]; do
    leader=$(as_admin status --json 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); l=[n["node_id"] for n in d["nodes"] if n.get("state")=="leader"]; print(l[0] if l else "")' 2>/dev/null || true)
    if [ -n "$leader" ]; then echo "$leader"; return 0; fi
    sleep 0.2
  done
  return 1
}

stop_node() {
  local i=$1 pid
  pid=$(live_pid "$i") || { rm -f "$CLUSTER_DIR/node$i.pid"; return 0; }
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do live_pid "$i" >/dev/null || break; sleep 0.1; done
  if live_pid "$i" >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$CLUSTER_DIR/node$i.pid"
  echo "node $i stopped"
}

demo() {
  echo
  echo "== a fenced lock, as tenant $DEMO_TENANT =="
  echo "\$ leasehold lock demo/orders-42 --try -- sh -c 'echo \"charging order 42 with fencing token \$LEASEHOLD_FENCING_TOKEN\"'"
  as_demo lock demo/orders-42 --try -- sh -c 'echo "charging order 42 with fencing token $LEASEHOLD_FENCING_TOKEN"'
  as_demo lock demo/orders-42 --try -- sh -c 'echo "a later holder gets a larger token: $LEASEHOLD_FENCING_TOKEN"'
  echo "A storage that keeps the highest token per order rejects a write that carries an older one."
}

# What a shell needs to use the cluster as tenant `demo` (and as the admin for
# `member` and `tenant`), as eval-able lines.
print_env() {
  echo "unset LEASEHOLD_CERT_FILE LEASEHOLD_KEY_FILE LEASEHOLD_INSECURE_PLAINTEXT LEASEHOLD_TOKEN"
  echo "export LEASEHOLD_ENDPOINTS=$(endpoints)"
  printf 'export LEASEHOLD_CA_FILE=%q\n' "$CA_FILE"
  printf 'export LEASEHOLD_TOKEN_FILE=%q\n' "$DEMO_TOKEN_FILE"
  printf 'export LEASEHOLD_ADMIN_TOKEN_FILE=%q\n' "$ADMIN_TOKEN_FILE"
  if [[ ":$PATH:" != *":$LEASEHOLD_BIN:"* ]]; then
    printf 'export PATH=%q:"$PATH"\n' "$LEASEHOLD_BIN"
  fi
}

# Sends SIGHUP to node $1 and shows what its log says about the reload; fails if
# something did not load (the node then keeps what it had).
reload_node() {
  local i=$1 pid log offset deadline lines
  pid=$(live_pid "$i") || die "node $i is not running"
  log="$CLUSTER_DIR/node$i.log"
  offset=$(stat -c %s "$log")
  kill -HUP "$pid"
  echo "node $i: SIGHUP sent (pid $pid)"
  # It logs one line for the admin token and one for the certificates.
  deadline=$((SECONDS + 5))
  while lines=$(tail -c +"$((offset + 1))" "$log" | sed 's/\x1b\[[0-9;]*m//g' | grep 'SIGHUP' || true)
    [ "$(grep -c . <<<"$lines")" -lt 2 ]; do
    [ $SECONDS -lt "$deadline" ] || die "node $i logged no reload within 5 s; see ./cluster.sh logs $i"
    sleep 0.1
  done
  echo "$lines"
  ! grep -q 'did not load' <<<"$lines" || die "node $i kept its old files; fix them and reload again"
}

command=${1:-help}
case "$command" in
  start)
    n=${2:-3}
    [[ "$n" =~ ^[35]$ ]] || die "start takes 3 or 5 nodes, got '$n'"
    if [ -f "$CLUSTER_DIR/size" ] && [ "$(size)" != "$n" ]; then
      die "a $(size)-node cluster exists in $CLUSTER_DIR; run './cluster.sh clean' first"
    fi
    build
    mkdir -p "$CLUSTER_DIR"
    echo "$n" >"$CLUSTER_DIR/size"
    make_credentials "$n"
    for i in $(seq 1 "$n"); do start_node "$i"; done
    for i in $(seq 1 "$n"); do wait_listening "$i" 30; done
    leader=$(wait_for_leader 30) || die "no leader after 30 s; see ./cluster.sh logs 1"
    echo "leader: node $leader"
    ensure_demo_tenant
    echo "endpoints: $(endpoints)"
    echo "CLI: $CLI"
    echo "status page: https://$(status_addr "$leader")/ (the leader's; every node serves one)"
    echo "  sign in with the admin token, the first line of $ADMIN_TOKEN_FILE"
    echo "  the certificate is the cluster's own: trust $CA_FILE or accept the browser's warning"
    echo "metrics: https://$(metrics_addr "$leader")/metrics on each node, with the scrape token:"
    echo "  curl --cacert $CA_FILE -H \"Authorization: Bearer \$(head -1 $SCRAPE_TOKEN_FILE)\" https://$(metrics_addr "$leader")/metrics"
    demo
    echo
    echo "To use the cluster from this shell (as tenant $DEMO_TENANT; admin commands as the admin):"
    echo "  eval \"\$(./cluster.sh env)\""
    ;;
  env)
    [ -f "$CLUSTER_DIR/size" ] || die "no cluster in $CLUSTER_DIR; start one with ./cluster.sh start"
    print_env
    ;;
  stop)
    for i in $(seq 1 "$(size)"); do stop_node "$i"; done
    ;;
  status)
    for i in $(seq 1 "$(size)"); do
      if pid=$(live_pid "$i"); then
        state=$(awk '{print $3}' "/proc/$pid/stat")
        [ "$state" = "T" ] && echo "node $i: pid $pid (paused)" || echo "node $i: pid $pid"
      else
        echo "node $i: not running"
      fi
    done
    echo
    as_admin status
    ;;
  kill)
    check_node "${2:-}"
    pid=$(live_pid "$2") || die "node $2 is not running"
    kill -KILL "$pid"
    echo "node $2 killed (SIGKILL, pid $pid)"
    ;;
  restart)
    check_node "${2:-}"
    stop_node "$2" >/dev/null
    build
    make_credentials "$(size)"
    start_node "$2"
    wait_listening "$2" 30
    ;;
  pause)
    check_node "${2:-}"
    pid=$(live_pid "$2") || die "node $2 is not running"
    kill -STOP "$pid"
    echo "node $2 paused (SIGSTOP, pid $pid)"
    ;;
  resume)
    check_node "${2:-}"
    pid=$(live_pid "$2") || die "node $2 is not running"
    kill -CONT "$pid"
    echo "node $2 resumed (SIGCONT, pid $pid)"
    ;;
  reload)
    check_node "${2:-}"
    reload_node "$2"
    ;;
  logs)
    check_node "${2:-}"
    tail -n "${LINES_SHOWN:-60}" "$CLUSTER_DIR/node$2.log"
    ;;
  clean)
    if [ -d "$CLUSTER_DIR" ]; then
      for i in $(seq 1 "$(size)"); do stop_node "$i" >/dev/null; done
      rm -rf "$CLUSTER_DIR"
    fi
    echo "cluster data removed"
    ;;
  demo)
    demo
    ;;
  *)
    sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    [ "$command" = help ] || exit 2
    ;;
esac
