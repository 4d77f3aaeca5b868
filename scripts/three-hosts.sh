#!/usr/bin/env bash
# The README's three-machine setup ("Deploying", "Provisioning three machines",
# "Replacing a node") on three hosts made of network namespaces, run end to end:
#
#   sudo scripts/three-hosts.sh           # as root
#   scripts/three-hosts.sh                # as a user, where user namespaces work
#
# Three hosts node1.example, node2.example and node3.example (10.77.0.1-3) on a
# bridge, and an operator's shell beside them (10.77.0.254). Each host has its own
# network namespace, host name, /etc/leasehold (its config file from
# deploy/three-machines/, used verbatim, its certificate and the tokens) and
# /var/lib (the data directory /var/lib/leasehold). The operator makes the
# certificates with `leasehold cert`, starts `leasehold-server --config
# /etc/leasehold/nodeN.toml` on each host and, with the `leasehold` CLI: adds a
# tenant, takes a lock (the fencing token printed), checks that the older token is
# refused by `fence check`, replaces a follower (member remove, an empty data
# directory, --new-incarnation, member add), cuts the leader off with nftables (the
# majority goes on; the cut-off node's /readyz says not ok; healed, it catches up),
# and kills the leader with SIGKILL (a new leader; a lock; restarted on its data
# directory, it catches up).
#
# Everything runs in private mount, network and pid namespaces of its own (`unshare
# --mount --net --pid --fork`): the host's network is never touched, the addresses
# exist only inside, /etc/hosts and /etc/leasehold are mounted inside only, and
# when the script ends everything it started ends with it. It signals only the
# process ids it started. Work files go to a temporary directory, removed at the end
# (LEASEHOLD_THREE_HOSTS_KEEP=1 keeps it and prints where).
#
# Binaries: LEASEHOLD_BIN_DIR, else the target directory's release/ (scripts/env.sh);
# build first (`cargo build --release --locked -p leasehold-server -p leasehold`).
# Exit codes: 0 passed; 1 a step failed (the step, the reason and the nodes' last log
# lines are printed); 77 skipped (no root and no user namespaces, or `ip`, `nft`,
# `unshare` or `python3` missing), with the reason.
set -euo pipefail

readonly EXIT_SKIPPED=77
readonly SUBNET="10.77.0"
readonly OPERATOR_ADDRESS="$SUBNET.254"
readonly NODES=(1 2 3)
readonly CLIENT_PORT=7100
readonly PEER_PORT=7200
readonly METRICS_PORT=7300
# Deadlines, in seconds, each with what it waits for.
readonly LISTEN_WAIT_S=30     # a started node listens on its client port
readonly LEADER_WAIT_S=20     # a leader that every reachable node agrees on
readonly EXIT_WAIT_S=20       # a removed node stops by itself
readonly READY_WAIT_S=30      # /readyz says ok (or, cut off, not ok)
readonly CATCH_UP_WAIT_S=30   # a node applied what the leader committed meanwhile
readonly STOP_WAIT_S=10       # a node stops after SIGTERM (then SIGKILL)
readonly LOG_TAIL_LINES=30
readonly PARTITION_TABLE="leasehold_partition"

say() { printf 'three-hosts: %s\n' "$*"; }
skip() { say "SKIPPED: $*"; exit "$EXIT_SKIPPED"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# ---------------------------------------------------------------------------------
# Outside: checks, the work directory, and the private namespaces.
# ---------------------------------------------------------------------------------
outside() {
  local tool
  for tool in ip nft unshare python3 timeout; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is not installed (scripts/setup.sh installs it)"
  done
  local bin_dir="${LEASEHOLD_BIN_DIR:-}"
  if [ -z "$bin_dir" ]; then
    # shellcheck source=scripts/env.sh disable=SC1091
    source "$ROOT/scripts/env.sh"
    bin_dir="$LEASEHOLD_BIN"
  fi
  local binary
  for binary in leasehold leasehold-server; do
    if [ ! -x "$bin_dir/$binary" ]; then
      say "FAILED: $bin_dir/$binary is missing: build it first (cargo build --release --locked)" >&2
      exit 1
    fi
  done
  local user_namespace=()
  if [ "$(id -u)" -ne 0 ]; then
    # Without root, a user namespace grants what mounts, ip and nft need, inside it only.
    user_namespace=(--user --map-root-user)
    unshare "${user_namespace[@]}" --mount --net --uts true 2>/dev/null ||
      skip "not root, and user namespaces do not work here (unshare --user --map-root-user failed)"
  fi

  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-three-hosts.XXXXXX")"
  chmod 700 "$work"
  local namespace_pid=""
  # shellcheck disable=SC2317  # called by the trap below
  finish() {
    local status=$?
    trap - EXIT INT TERM HUP
    # The namespaces' first process; with --kill-child its end ends everything inside.
    if [ -n "$namespace_pid" ] && kill -0 "$namespace_pid" 2>/dev/null; then
      kill -KILL "$namespace_pid" 2>/dev/null || true
      wait "$namespace_pid" 2>/dev/null || true
    fi
    if [ "${LEASEHOLD_THREE_HOSTS_KEEP:-0}" = 1 ]; then
      say "kept the work directory $work"
    else
      rm -rf "$work"
    fi
    exit "$status"
  }
  trap finish EXIT
  trap 'say "interrupted"; exit 130' INT TERM HUP

  # The run's own copies, as an operator installs them: a build that replaces the
  # binaries meanwhile changes nothing here.
  mkdir "$work/bin"
  install -m 755 "$bin_dir/leasehold" "$bin_dir/leasehold-server" "$work/bin/"
  say "binaries copied from $bin_dir; work directory $work"
  say "entering private mount, network and pid namespaces${user_namespace:+ (in a user namespace)}"
  local status=0
  LEASEHOLD_THREE_HOSTS_INSIDE=1 THREE_HOSTS_WORK="$work" THREE_HOSTS_BIN="$work/bin" \
    unshare "${user_namespace[@]}" --mount --net --pid --fork --kill-child --mount-proc \
    bash "$ROOT/scripts/three-hosts.sh" &
  namespace_pid=$!
  wait "$namespace_pid" || status=$?
  namespace_pid=""
  exit "$status"
}

# ---------------------------------------------------------------------------------
# Inside: three hosts, an operator, and the steps.
# ---------------------------------------------------------------------------------
WORK="${THREE_HOSTS_WORK:-}"
OPERATOR_DIR="$WORK/operator"
# Process ids of the running nodes, by node id; only these are ever signalled.
declare -A NODE_PIDS=()
STEP="setting up"
FAILURE_REPORTED=0
# The script's own stderr, for failures reported where stderr is silenced.
STDERR_FD=2
STARTED_AT_US="${EPOCHREALTIME/./}"

fail() {
  exec 2>&"$STDERR_FD"
  FAILURE_REPORTED=1
  say "FAILED while $STEP: $*" >&2
  if [ -n "${LEASEHOLD_ENDPOINTS:-}" ]; then
    echo "---- leasehold status ----" >&2
    admin --request-timeout 2s status >&2 2>&1 || true
  fi
  local id
  for id in "${NODES[@]}"; do
    if [ -f "$(host_dir "$id")/server.log" ]; then
      echo "---- last $LOG_TAIL_LINES lines of node$id.example's log ----" >&2
      tail -n "$LOG_TAIL_LINES" "$(host_dir "$id")/server.log" >&2 || true
    fi
  done
  exit 1
}

step() {
  STEP="$*"
  say "== $*"
}

# Seconds since START_US (microseconds, as EPOCHREALTIME without its dot), to a tenth.
seconds_since() {
  local tenths=$(((${EPOCHREALTIME/./} - $1) / 100000))
  echo "$((tenths / 10)).$((tenths % 10))"
}

# wait_for SECONDS "what" COMMAND...: runs COMMAND until it succeeds, at most SECONDS.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  local start_us=${EPOCHREALTIME/./}
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      fail "no $what within ${seconds} s"
    fi
    sleep 0.2
  done
  say "   $what ($(seconds_since "$start_us") s)"
}

host_dir() { echo "$WORK/hosts/node$1"; }
host_name() { echo "node$1.example"; }
endpoint() { echo "$(host_name "$1"):$CLIENT_PORT"; }
endpoints_of() {
  local id list=""
  for id in "$@"; do list="$list${list:+,}$(endpoint "$id")"; done
  echo "$list"
}

# on_host ID COMMAND...: runs COMMAND on host ID: in its network namespace, with its
# host name, its /etc/leasehold and its /var/lib, in a mount namespace of its own (the
# mounts end with the command). Each step execs the next, so a process started with
# `exec` of HOST_COMMAND is the command itself (see start_node).
host_command() {
  local id=$1
  # shellcheck disable=SC2016  # expanded by that shell
  HOST_COMMAND=(ip netns exec "node$id" unshare --mount --uts sh -c '
    hostname "$1" && mount --bind "$2" /etc/leasehold && mount --bind "$3" /var/lib || exit 1
    shift 3
    exec "$@"' on_host "$(host_name "$id")" "$(host_dir "$id")/etc-leasehold" "$(host_dir "$id")/var-lib")
}
on_host() {
  host_command "$1"
  "${HOST_COMMAND[@]}" "${@:2}"
}

# The operator's CLI, from the operator's shell on the bridge: as the admin, or as the
# tenant `payments`.
admin() { LEASEHOLD_ADMIN_TOKEN_FILE=/etc/leasehold/admin.token "$THREE_HOSTS_BIN/leasehold" "$@"; }
tenant() { LEASEHOLD_TOKEN_FILE="$OPERATOR_DIR/payments.token" "$THREE_HOSTS_BIN/leasehold" "$@"; }

start_node() {
  local id=$1
  shift
  local log
  log="$(host_dir "$id")/server.log"
  echo "---- started $(date -u +%FT%TZ) with: --config /etc/leasehold/node$id.toml $* ----" >>"$log"
  host_command "$id"
  # The subshell execs the chain: $! is the server's own process id.
  (NO_COLOR=1 exec "${HOST_COMMAND[@]}" "$THREE_HOSTS_BIN/leasehold-server" --config "/etc/leasehold/node$id.toml" \
    "$@" >>"$log" 2>&1) &
  NODE_PIDS[$id]=$!
  say "   started leasehold-server on $(host_name "$id") (process ${NODE_PIDS[$id]})${*:+ with $*}"
  wait_for "$LISTEN_WAIT_S" "$(host_name "$id") listening on $CLIENT_PORT" node_listens "$id"
  [ "$(readlink -f "/proc/${NODE_PIDS[$id]}/exe")" = "$(readlink -f "$THREE_HOSTS_BIN/leasehold-server")" ] ||
    fail "process ${NODE_PIDS[$id]} is not leasehold-server: the script would signal the wrong process"
}

# Whether node ID's process runs and takes connections on its client port; fails the
# run at once if the process ended.
node_listens() {
  local id=$1 pid=${NODE_PIDS[$1]}
  if ! kill -0 "$pid" 2>/dev/null; then
    local status=0
    wait "$pid" 2>/dev/null || status=$?
    unset "NODE_PIDS[$id]"
    fail "leasehold-server on $(host_name "$id") exited with code $status while starting"
  fi
  timeout 1 bash -c "exec 3<>/dev/tcp/$(host_name "$id")/$CLIENT_PORT" 2>/dev/null
}

# Whether node ID's process has ended; reaps it and records its exit code.
EXIT_CODE=""
node_exited() {
  local id=$1 pid=${NODE_PIDS[$1]}
  kill -0 "$pid" 2>/dev/null && return 1
  EXIT_CODE=0
  # Quietly: bash would report a killed job on stderr.
  wait "$pid" 2>/dev/null || EXIT_CODE=$?
  unset "NODE_PIDS[$id]"
}

# Stops node ID: SIGTERM, then SIGKILL after STOP_WAIT_S; its exit code in EXIT_CODE.
stop_node() {
  local id=$1 pid=${NODE_PIDS[$1]:-}
  EXIT_CODE=0
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_WAIT_S))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || EXIT_CODE=$?
  unset "NODE_PIDS[$id]"
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM ERR
  if [ "$status" -ne 0 ] && [ "$status" -ne 130 ] && [ "$FAILURE_REPORTED" -eq 0 ]; then
    (fail "a command exited with code $status") || true
  fi
  local id
  for id in "${!NODE_PIDS[@]}"; do stop_node "$id"; done
  for id in "${NODES[@]}"; do
    ip netns exec "node$id" nft delete table inet "$PARTITION_TABLE" 2>/dev/null || true
    ip netns delete "node$id" 2>/dev/null || true
  done
  exit "$status"
}

# Status as JSON, asked of the given nodes; empty when none answered.
status_json() {
  admin --endpoints "$(endpoints_of "$@")" --request-timeout 2s status --json 2>/dev/null || true
}

# Reads JSON on stdin and runs the Python expression's statements with `data` bound.
json() { python3 -c "import json, sys; data = json.load(sys.stdin); $1" "${@:2}"; }

# The leader that every node of IDS that answers agrees on, itself saying it leads;
# prints its id and succeeds, or fails.
LEADER=""
agreed_leader() {
  local text
  text="$(status_json "$@")"
  [ -n "$text" ] || return 1
  LEADER="$(json '
nodes = [n for n in data["nodes"] if n["reachable"]]
leaders = {n["leader_id"] for n in nodes}
leader = next(iter(leaders)) if len(leaders) == 1 else 0
leads = any(n["node_id"] == leader and n["state"].lower() == "leader" for n in nodes)
print(leader if leader and leads and len(nodes) == int(sys.argv[1]) else "")' "$#" <<<"$text")"
  [ -n "$LEADER" ]
}

# A leader that the nodes of IDS agree on and that is not EXCLUDED.
leader_other_than() {
  local excluded=$1
  shift
  agreed_leader "$@" && [ "$LEADER" != "$excluded" ]
}

# Node ID's own applied index (0 when it does not answer).
applied_index() {
  status_json "$1" | json 'print(next((n["applied_index"] for n in data["nodes"] if n["reachable"]), 0))' 2>/dev/null ||
    echo 0
}

caught_up() {
  local id=$1 index=$2
  [ "$(applied_index "$id")" -ge "$index" ]
}

# Node ID's /readyz, asked with the scrape token from the operator's shell, as a
# scraper asks it (HTTPS, the cluster CA, no proxy): prints "STATUS FIRST-LINE".
readyz() {
  python3 - "$(host_name "$1"):$METRICS_PORT" /etc/leasehold/pki/ca.pem /etc/leasehold/scrape.token <<'EOF'
import ssl, sys, urllib.error, urllib.request
address, ca_file, token_file = sys.argv[1:4]
with open(token_file) as file:
    token = file.readline().strip()
context = ssl.create_default_context(cafile=ca_file)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
request = urllib.request.Request(f"https://{address}/readyz", headers={"Authorization": f"Bearer {token}"})
try:
    with opener.open(request, timeout=2) as answer:
        status, body = answer.status, answer.read()
except urllib.error.HTTPError as error:
    status, body = error.code, error.read()
except OSError as error:
    status, body = 0, str(error).encode()
print(status, (body.decode(errors="replace").splitlines() or [""])[0])
EOF
}
READYZ=""
readyz_is() {
  local id=$1 want=$2
  READYZ="$(readyz "$id")"
  [ "${READYZ%% *}" = "$want" ]
}

# Takes the lock NAME as the tenant, holds it while a command prints its fencing
# token, and releases it: the token in TOKEN.
TOKEN=""
take_lock() {
  local name=$1
  # shellcheck disable=SC2016  # the holder's shell expands it
  TOKEN="$(tenant lock "$name" --ttl 10s --wait 20s -- sh -c 'echo "$LEASEHOLD_FENCING_TOKEN"')" ||
    fail "leasehold lock $name exited with code $?"
  [[ "$TOKEN" =~ ^[0-9]+$ ]] || fail "leasehold lock $name printed no fencing token: '$TOKEN'"
}

member_json() {
  admin member list --json 2>/dev/null
}

# Whether node ID is a voter whose recorded incarnation is not OLD.
voter_with_new_incarnation() {
  local id=$1 old=$2 text
  text="$(member_json)" || return 1
  json '
member = next((m for m in data if m["node_id"] == int(sys.argv[1])), None)
sys.exit(0 if member and member["role"].lower() == "voter" and str(member["incarnation"]) not in ("", "0", sys.argv[2]) else 1)
' "$id" "$old" <<<"$text"
}

incarnation_of() {
  member_json | json '
print(next((m["incarnation"] for m in data if m["node_id"] == int(sys.argv[1])), ""))' "$1"
}

inside() {
  exec {STDERR_FD}>&2
  trap cleanup EXIT
  trap 'say "interrupted"; exit 130' INT TERM
  trap 'fail "\`$BASH_COMMAND\` failed (line $LINENO)"' ERR
  cd "$WORK"

  step "making the hosts: node1-3.example on a bridge, in private namespaces"
  # ip netns keeps its namespace handles under /run/netns: a /run of our own.
  mount -t tmpfs -o mode=755 three-hosts-run /run
  # The operator's /etc/leasehold, in an overlay of /etc seen only here; each host's
  # own /etc/leasehold is mounted over it for that host's commands (on_host).
  mkdir -p "$WORK/etc-overlay/upper/leasehold" "$WORK/etc-overlay/work"
  mount -t overlay three-hosts-etc \
    -o "lowerdir=/etc,upperdir=$WORK/etc-overlay/upper,workdir=$WORK/etc-overlay/work" /etc
  cat >"$WORK/etc-hosts" <<EOF
127.0.0.1 localhost
$SUBNET.1 node1.example
$SUBNET.2 node2.example
$SUBNET.3 node3.example
$OPERATOR_ADDRESS operator.example
EOF
  mount --bind "$WORK/etc-hosts" /etc/hosts
  ip link set lo up
  ip link add three-hosts type bridge
  ip addr add "$OPERATOR_ADDRESS/24" dev three-hosts
  ip link set three-hosts up
  local id
  for id in "${NODES[@]}"; do
    ip netns add "node$id"
    ip link add "veth-node$id" type veth peer name eth0 netns "node$id"
    ip link set "veth-node$id" master three-hosts up
    ip -n "node$id" link set lo up
    ip -n "node$id" addr add "$SUBNET.$id/24" dev eth0
    ip -n "node$id" link set eth0 up
    mkdir -p "$(host_dir "$id")/etc-leasehold" "$(host_dir "$id")/var-lib"
    chmod 700 "$(host_dir "$id")/etc-leasehold"
  done
  say "   hosts: $(tr '\n' ' ' <"$WORK/etc-hosts")"
  say "   host names seen on the hosts: $(for id in "${NODES[@]}"; do on_host "$id" hostname; done | tr '\n' ' ')"

  step "provisioning (README, Security): a CA, node certificates and tokens with leasehold cert"
  mkdir -p "$OPERATOR_DIR"
  chmod 700 "$OPERATOR_DIR"
  local cli="$THREE_HOSTS_BIN/leasehold"
  "$cli" cert ca /etc/leasehold/pki >/dev/null
  for id in "${NODES[@]}"; do
    # The host name alone: every client and peer dials the nodes by name.
    "$cli" cert node /etc/leasehold/pki --id "$id" --host "node$id.example" >/dev/null
  done
  "$cli" new-token --prefix admin >/etc/leasehold/admin.token && chmod 600 /etc/leasehold/admin.token
  "$cli" new-token --prefix scrape >/etc/leasehold/scrape.token && chmod 600 /etc/leasehold/scrape.token
  say "   /etc/leasehold/pki: $(cd /etc/leasehold/pki && echo *)"

  step "placing each host's files: its config from deploy/three-machines/, node-I.pem as nodeI.pem"
  for id in "${NODES[@]}"; do
    local etc
    etc="$(host_dir "$id")/etc-leasehold"
    cp "$ROOT/deploy/three-machines/node$id.toml" "$etc/node$id.toml"
    install -m 644 "/etc/leasehold/pki/node-$id.pem" "$etc/node$id.pem"
    install -m 600 "/etc/leasehold/pki/node-$id.key" "$etc/node$id.key"
    install -m 644 /etc/leasehold/pki/ca.pem "$etc/ca.pem"
    install -m 600 /etc/leasehold/admin.token "$etc/admin.token"
    install -m 600 /etc/leasehold/scrape.token "$etc/scrape.token"
    say "   $(host_name "$id"):/etc/leasehold: $(on_host "$id" ls /etc/leasehold | tr '\n' ' ')"
  done

  export LEASEHOLD_ENDPOINTS
  LEASEHOLD_ENDPOINTS="$(endpoints_of "${NODES[@]}")"
  export LEASEHOLD_CA_FILE=/etc/leasehold/pki/ca.pem
  unset LEASEHOLD_TOKEN_FILE LEASEHOLD_ADMIN_TOKEN_FILE LEASEHOLD_CERT_FILE LEASEHOLD_KEY_FILE LEASEHOLD_REQUEST_TIMEOUT \
    LEASEHOLD_INSECURE_PLAINTEXT
  say "   the operator's CLI: LEASEHOLD_ENDPOINTS=$LEASEHOLD_ENDPOINTS LEASEHOLD_CA_FILE=$LEASEHOLD_CA_FILE"

  step "starting leasehold-server --config /etc/leasehold/nodeN.toml on each host"
  for id in "${NODES[@]}"; do start_node "$id"; done
  wait_for "$LEADER_WAIT_S" "leader every node agrees on" agreed_leader "${NODES[@]}"
  say "   node$LEADER.example leads"
  admin status | sed 's/^/   /'

  step "adding the tenant payments"
  (cd "$OPERATOR_DIR" && admin tenant add payments --token-file payments.token >/dev/null) ||
    fail "leasehold tenant add payments failed"
  [ -s "$OPERATOR_DIR/payments.token" ] || fail "tenant add wrote no payments.token"
  say "   payments.token written"

  step "taking the lock orders/42 and checking the fence"
  local first second
  take_lock orders/42
  first=$TOKEN
  say "   orders/42 granted with fencing token $first (and released)"
  # The next holder checks both tokens while it holds the lock: a token is current only
  # while its grant holds.
  local checks
  # shellcheck disable=SC2016  # the holder's shell expands them
  checks="$(tenant lock orders/42 --ttl 10s --wait 20s -- sh -c '
    older=0; "$1" fence check orders/42 "$2" >"$3" 2>&1 || older=$?
    own=0; "$1" fence check orders/42 "$LEASEHOLD_FENCING_TOKEN" >>"$3" 2>&1 || own=$?
    echo "$LEASEHOLD_FENCING_TOKEN $older $own"' holder "$THREE_HOSTS_BIN/leasehold" "$first" \
    "$OPERATOR_DIR/fence-check.out")" || fail "leasehold lock orders/42 (the second holder) exited with code $?"
  local older own
  read -r second older own <<<"$checks"
  say "   orders/42 granted with fencing token $second"
  [ "$second" -gt "$first" ] || fail "the second grant's token $second is not above the first's $first"
  [ "$older" -eq 1 ] || fail "fence check of the older token $first exited $older, not 1 (superseded)"
  say "   while it holds: fence check orders/42 $first: superseded (exit 1): $(head -n 1 "$OPERATOR_DIR/fence-check.out")"
  [ "$own" -eq 0 ] || fail "fence check of the holder's own token $second exited $own, not 0 (current)"
  say "   while it holds: fence check orders/42 $second: current (exit 0)"
  local last_token=$second

  wait_for "$LEADER_WAIT_S" "leader every node agrees on" agreed_leader "${NODES[@]}"
  local replaced=""
  for id in 3 2 1; do
    if [ "$id" != "$LEADER" ]; then
      replaced=$id
      break
    fi
  done
  step "replacing the follower node$replaced.example (README, Replacing a node)"
  local old_incarnation
  old_incarnation="$(incarnation_of "$replaced")"
  say "   its incarnation: $old_incarnation"
  admin member remove "$replaced" >/dev/null || fail "leasehold member remove $replaced failed"
  say "   leasehold member remove $replaced"
  wait_for "$EXIT_WAIT_S" "exit of the removed node$replaced.example" node_exited "$replaced"
  [ "$EXIT_CODE" -eq 0 ] || fail "the removed node exited with code $EXIT_CODE, not 0"
  say "   node$replaced.example stopped by itself with code 0"
  on_host "$replaced" sh -c 'rm -rf /var/lib/leasehold && mkdir /var/lib/leasehold' ||
    fail "could not empty node$replaced.example's /var/lib/leasehold"
  say "   on node$replaced.example: rm -rf /var/lib/leasehold && mkdir /var/lib/leasehold"
  start_node "$replaced" --new-incarnation
  admin member add "$replaced" "node$replaced.example:$CLIENT_PORT" "node$replaced.example:$PEER_PORT" >/dev/null ||
    fail "leasehold member add $replaced failed"
  say "   leasehold member add $replaced node$replaced.example:$CLIENT_PORT node$replaced.example:$PEER_PORT"
  wait_for "$CATCH_UP_WAIT_S" "node$replaced.example a voter under a new incarnation" \
    voter_with_new_incarnation "$replaced" "$old_incarnation"
  say "   its new incarnation: $(incarnation_of "$replaced")"
  wait_for "$READY_WAIT_S" "ok from node$replaced.example's /readyz" readyz_is "$replaced" 200
  wait_for "$CATCH_UP_WAIT_S" "catch-up of node$replaced.example to index $last_token" \
    caught_up "$replaced" "$last_token"
  local token
  take_lock orders/42
  token=$TOKEN
  [ "$token" -gt "$last_token" ] || fail "token $token after the replacement is not above $last_token"
  say "   orders/42 granted with fencing token $token"
  last_token=$token

  wait_for "$LEADER_WAIT_S" "leader every node agrees on" agreed_leader "${NODES[@]}"
  local cut_off=$LEADER others=()
  for id in "${NODES[@]}"; do [ "$id" = "$cut_off" ] || others+=("$id"); done
  step "cutting the leader node$cut_off.example off from node${others[0]} and node${others[1]} (nftables, DROP)"
  ip netns exec "node$cut_off" nft -f - <<EOF || fail "nft could not add the partition's rules"
table inet $PARTITION_TABLE {
  chain out { type filter hook output priority 0; ip daddr { $SUBNET.${others[0]}, $SUBNET.${others[1]} } drop; }
  chain in { type filter hook input priority 0; ip saddr { $SUBNET.${others[0]}, $SUBNET.${others[1]} } drop; }
}
EOF
  wait_for "$LEADER_WAIT_S" "new leader in the majority" leader_other_than "$cut_off" "${others[@]}"
  say "   node$LEADER.example leads the majority"
  take_lock orders/42
  token=$TOKEN
  [ "$token" -gt "$last_token" ] || fail "token $token in the majority is not above $last_token"
  say "   the majority serves: orders/42 granted with fencing token $token"
  last_token=$token
  for id in "${others[@]}"; do
    wait_for "$READY_WAIT_S" "ok from the majority's node$id.example's /readyz" readyz_is "$id" 200
  done
  wait_for "$READY_WAIT_S" "'not ok' from the cut-off node$cut_off.example's /readyz" readyz_is "$cut_off" 503
  say "   node$cut_off.example /readyz: $READYZ"
  ip netns exec "node$cut_off" nft delete table inet "$PARTITION_TABLE" || fail "nft could not heal"
  say "   healed (nft delete table inet $PARTITION_TABLE)"
  wait_for "$READY_WAIT_S" "ok from node$cut_off.example's /readyz" readyz_is "$cut_off" 200
  wait_for "$CATCH_UP_WAIT_S" "catch-up of node$cut_off.example to index $last_token" caught_up "$cut_off" "$last_token"
  wait_for "$LEADER_WAIT_S" "leader every node agrees on" agreed_leader "${NODES[@]}"

  local killed=$LEADER
  step "killing the leader node$killed.example (kill -9 of process ${NODE_PIDS[$killed]})"
  kill -KILL "${NODE_PIDS[$killed]}"
  # Without bash's own report of a killed job.
  wait_for "$EXIT_WAIT_S" "exit of the killed node$killed.example" node_exited "$killed" 2>/dev/null
  [ "$EXIT_CODE" -eq 137 ] || fail "the killed node exited with code $EXIT_CODE, not 137 (SIGKILL)"
  others=()
  for id in "${NODES[@]}"; do [ "$id" = "$killed" ] || others+=("$id"); done
  wait_for "$LEADER_WAIT_S" "new leader" leader_other_than "$killed" "${others[@]}"
  say "   node$LEADER.example leads"
  take_lock orders/42
  token=$TOKEN
  [ "$token" -gt "$last_token" ] || fail "token $token after the kill is not above $last_token"
  say "   orders/42 granted with fencing token $token"
  last_token=$token
  start_node "$killed"
  wait_for "$READY_WAIT_S" "ok from node$killed.example's /readyz" readyz_is "$killed" 200
  wait_for "$CATCH_UP_WAIT_S" "catch-up of node$killed.example to index $last_token" caught_up "$killed" "$last_token"
  wait_for "$LEADER_WAIT_S" "leader every node agrees on" agreed_leader "${NODES[@]}"
  admin status | sed 's/^/   /'

  step "stopping the nodes (SIGTERM)"
  for id in "${NODES[@]}"; do
    stop_node "$id"
    [ "$EXIT_CODE" -eq 0 ] || fail "node$id.example exited with code $EXIT_CODE after SIGTERM, not 0"
  done
  say "PASSED in $(seconds_since "$STARTED_AT_US") s: tenant, lock and fence, member replace of node$replaced, partition of node$cut_off, kill -9 of node$killed; last token $last_token"
}

if [ "${LEASEHOLD_THREE_HOSTS_INSIDE:-}" = 1 ]; then
  inside
else
  outside
fi
