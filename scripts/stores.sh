#!/usr/bin/env bash
# Private, throwaway instances of the data stores the fenced-write adapters are tested
# against (docs/fenced-writes.md), on 127.0.0.1 only.
#
#   scripts/stores.sh start   NAME [INSTANCE]   initialise (once) and start it; wait until it answers
#   scripts/stores.sh stop    NAME [INSTANCE]   stop it (the process id this script recorded)
#   scripts/stores.sh restart NAME [INSTANCE]   stop, then start on the same data
#   scripts/stores.sh status  NAME [INSTANCE]   exit 0 when it is running
#   scripts/stores.sh url     NAME [INSTANCE]   print the URL a client uses
#
# NAME is redis, mariadb, etcd or postgres. INSTANCE is a digit, 0 by default: each
# instance has its own port (base + INSTANCE) and data directory, so a test can restart
# an instance of its own without disturbing instance 0, which other tests share.
#
#   redis     port 16379+I   redis://127.0.0.1:PORT/                  appendonly, appendfsync always
#   mariadb   port 13306+I   mysql://root@127.0.0.1:PORT/leasehold    database `leasehold`
#   etcd      port 12379+I   http://127.0.0.1:PORT                    peer port 12479+I
#   postgres  port 15432+I   scripts/postgres.sh's URL                instance 0 is scripts/postgres.sh's
#   s3        port 19000+I   http://KEY:SECRET@127.0.0.1:PORT/leasehold?region=us-east-1
#                            moto's S3 server (PyPI `moto[server]`), bucket `leasehold`
#
# The ports lie below 32768, outside the kernel's range for outgoing connections'
# local ports (32768-60999): a client socket that happened to take a store's port
# would keep a restarted instance from binding it.
#
# The data lives in /var/cache/leasehold/stores when that is writable (shared by every
# checkout on the machine, like the target directory), else .stores/ in the checkout;
# LEASEHOLD_STORES_DIR overrides it. Each instance has a directory NAME-INSTANCE/ there
# with its data, its log (NAME.log) and the recorded process id (pid). Postgres is
# scripts/postgres.sh with LEASEHOLD_POSTGRES_PORT and, for instances other than 0,
# LEASEHOLD_POSTGRES_DIR=<stores>/postgres-INSTANCE.
#
# Each server runs in a session of its own (setsid), so the caller's Ctrl-C or the end
# of its shell does not stop it; `stop` signals only the recorded process id, and only
# when that process is still the expected program. Redis and etcd keep their writes
# across a restart (fsync on every write, etcd's default); MariaDB's InnoDB flushes
# its log at every commit (its default). MariaDB runs with --skip-grant-tables: any
# user, no password. Acceptable for a throwaway instance that listens on 127.0.0.1
# only; never point it at data that matters. As root, mariadbd runs as the `mysql`
# user (it refuses to run as root), redis and etcd as root.
#
# S3 is moto's server, installed from PyPI into a virtual environment beside the data
# (moto-venv/) on first use; Debian packages no S3 server. It checks every request's
# SigV4 signature: the first three requests after a start (moto's
# INITIAL_NO_AUTH_ACTION_COUNT) create an IAM user with S3 rights and its access key,
# which the URL carries; the key is new at every start. moto keeps everything in
# memory: a restarted instance is empty, with a new key.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

die() { echo "stores.sh: $*" >&2; exit 1; }

usage() {
  echo "usage: $0 start|stop|restart|status|url redis|mariadb|etcd|postgres|s3 [INSTANCE 0-9]" >&2
  exit 2
}

if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage; fi
COMMAND="$1"
NAME="$2"
INSTANCE="${3:-0}"
case "$COMMAND" in start | stop | restart | status | url) ;; *) usage ;; esac
case "$NAME" in redis | mariadb | etcd | postgres | s3) ;; *) usage ;; esac
[[ "$INSTANCE" =~ ^[0-9]$ ]] || usage

if [ -n "${LEASEHOLD_STORES_DIR:-}" ]; then
  STORES="$LEASEHOLD_STORES_DIR"
elif mkdir -p /var/cache/leasehold/stores 2>/dev/null && [ -w /var/cache/leasehold/stores ]; then
  STORES=/var/cache/leasehold/stores
else
  STORES="$LEASEHOLD_ROOT/.stores"
fi

# One command at a time per instance: tests that share instance 0 start it from
# several processes at once, and two first starts would initialise one data
# directory twice. flock -o keeps the lock in flock's own process, so the servers a
# start leaves running do not hold it.
if [ "$COMMAND" != url ] && [ -z "${LEASEHOLD_STORES_LOCKED:-}" ]; then
  command -v flock >/dev/null || die "flock is missing (util-linux; scripts/setup.sh installs it)"
  mkdir -p "$STORES"
  LEASEHOLD_STORES_LOCKED=1 exec flock -o "$STORES/$NAME-$INSTANCE.lock" "$0" "$@"
fi

# PostgreSQL already has a script of its own.
if [ "$NAME" = postgres ]; then
  if [ "$INSTANCE" -ne 0 ]; then
    mkdir -p "$STORES"
    export LEASEHOLD_POSTGRES_PORT=$((15432 + INSTANCE))
    export LEASEHOLD_POSTGRES_DIR="$STORES/postgres-$INSTANCE"
  fi
  exec "$LEASEHOLD_ROOT/scripts/postgres.sh" "$COMMAND"
fi

DIR="$STORES/$NAME-$INSTANCE"
LOG="$DIR/$NAME.log"
PID_FILE="$DIR/pid"
case "$NAME" in
  redis)
    PORT=$((16379 + INSTANCE))
    PROGRAM=redis-server
    ;;
  mariadb)
    PORT=$((13306 + INSTANCE))
    PROGRAM=mariadbd
    SOCKET="$DIR/mysqld.sock"
    DATA="$DIR/data"
    ;;
  etcd)
    PORT=$((12379 + INSTANCE))
    PEER_PORT=$((12479 + INSTANCE))
    PROGRAM=etcd
    DATA="$DIR/data"
    ;;
  s3)
    PORT=$((19000 + INSTANCE))
    PROGRAM=moto_server
    MOTO_VENV="$STORES/moto-venv"
    MOTO_VERSION=5.2.6
    ;;
esac
WHAT="$NAME-$INSTANCE"

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is missing; run scripts/setup.sh (apt-get install $2)"
}

url() {
  case "$NAME" in
    redis) echo "redis://127.0.0.1:$PORT/" ;;
    mariadb) echo "mysql://root@127.0.0.1:$PORT/leasehold" ;;
    etcd) echo "http://127.0.0.1:$PORT" ;;
    s3)
      running_pid >/dev/null && [ -f "$DIR/url" ] || die "$WHAT is not running: scripts/stores.sh start s3 $INSTANCE"
      cat "$DIR/url"
      ;;
  esac
}

# Whether a process exists and has not exited (an exited child of a parent that does
# not reap it stays a zombie, which `kill -0` still finds).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

# The server's process id, if the one recorded in its directory runs.
running_pid() {
  local pid
  [ -f "$PID_FILE" ] || return 1
  pid=$(head -n 1 "$PID_FILE")
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  # A stale file after a reboot can name a process id that something else now has:
  # the program must be ours, listening on this instance's port.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$PROGRAM" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "[:=]$PORT\b" || return 1
  echo "$pid"
}

port_open() { (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

# Whether the server answers a real request.
answers() {
  case "$NAME" in
    redis) [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = PONG ] ;;
    mariadb) mariadb-admin --no-defaults --socket="$SOCKET" --connect-timeout=2 ping >/dev/null 2>&1 ;;
    etcd)
      ETCDCTL_API=3 etcdctl --endpoints="$(url)" --dial-timeout=2s --command-timeout=3s \
        endpoint health >/dev/null 2>&1
      ;;
    # moto's own API, which does not count as one of the unauthenticated requests.
    s3) "$MOTO_VENV/bin/python" -c "import urllib.request as r; r.urlopen('http://127.0.0.1:$PORT/moto-api/', timeout=2)" >/dev/null 2>&1 ;;
  esac
}

log_tail() {
  echo "--- last lines of $LOG:" >&2
  tail -n 20 "$LOG" >&2 2>/dev/null || true
}

# Starts "$@" detached in a session of its own, its output appended to the log; the
# shell that execs it records its process id first.
launch() {
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid sh -c 'echo $$ >"$0" && exec "$@"' "$PID_FILE" "$@" </dev/null >>"$LOG" 2>&1 &
}

init_mariadb() {
  if [ -d "$DATA" ] && [ ! -f "$DIR/initialised" ]; then
    echo "stores.sh: $WHAT: removing $DATA, an initialisation that did not finish"
    rm -rf "$DATA"
  fi
  [ -d "$DATA" ] && return 0
  echo "stores.sh: $WHAT: initialising $DATA"
  local as_root=()
  [ "$(id -u)" -ne 0 ] || as_root=(--user=mysql)
  mariadb-install-db --no-defaults "${as_root[@]}" --datadir="$DATA" \
    --auth-root-authentication-method=normal --skip-test-db >"$DIR/install.log" 2>&1 ||
    die "mariadb-install-db failed; see $DIR/install.log"
  touch "$DIR/initialised"
}

# moto's server in a virtual environment of its own, made once for every instance.
install_moto() {
  [ -x "$MOTO_VENV/bin/moto_server" ] && return 0
  need python3 python3-venv
  (
    flock 9
    [ -x "$MOTO_VENV/bin/moto_server" ] && exit 0
    echo "stores.sh: installing moto[server]==$MOTO_VERSION into $MOTO_VENV (PyPI)"
    rm -rf "$MOTO_VENV"
    python3 -m venv "$MOTO_VENV" && "$MOTO_VENV/bin/pip" install --quiet "moto[server]==$MOTO_VERSION"
  ) 9>"$STORES/moto-venv.lock" || die "could not install moto into $MOTO_VENV"
}

# The IAM user, its key and the bucket, in the first requests after a start, and the
# URL with the key.
setup_s3() {
  "$MOTO_VENV/bin/python" - "$PORT" "$DIR/url" <<'PY' || die "could not set up $WHAT's user and bucket; see $LOG"
import json, sys, urllib.parse
import boto3
port, url_file = sys.argv[1], sys.argv[2]
endpoint = f"http://127.0.0.1:{port}"
anonymous = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **anonymous)
iam.create_user(UserName="leasehold")
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_user_policy(UserName="leasehold", PolicyName="s3", PolicyDocument=json.dumps(policy))
key = iam.create_access_key(UserName="leasehold")["AccessKey"]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket="leasehold")
quote = lambda text: urllib.parse.quote(text, safe="")
with open(url_file + ".new", "w") as out:
    out.write(f"http://{quote(key['AccessKeyId'])}:{quote(key['SecretAccessKey'])}@127.0.0.1:{port}/leasehold?region=us-east-1\n")
PY
  mv "$DIR/url.new" "$DIR/url"
}

start() {
  local pid deadline
  if pid=$(running_pid); then
    echo "stores.sh: $WHAT running (pid $pid) on 127.0.0.1:$PORT, data $DIR"
    return 0
  fi
  port_open "$PORT" && die "127.0.0.1:$PORT is taken by a process this script did not start ($WHAT)"
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  rm -f "$PID_FILE"
  echo "=== stores.sh: starting $WHAT at $(date -u +%FT%TZ)" >>"$LOG"
  case "$NAME" in
    redis)
      need redis-server redis-server
      need redis-cli redis-tools
      launch redis-server --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --appendonly yes \
        --appendfsync always --save "" --daemonize no
      ;;
    mariadb)
      need mariadbd mariadb-server
      need mariadb-admin mariadb-client
      # A Unix socket's path holds at most 107 bytes.
      [ "${#SOCKET}" -le 107 ] || die "$SOCKET is too long for a Unix socket; set LEASEHOLD_STORES_DIR"
      local as_root=()
      if [ "$(id -u)" -eq 0 ]; then
        # mariadbd refuses to run as root: it switches to `mysql`, which must be able to
        # write the directory and the log.
        as_root=(--user=mysql)
        touch "$LOG"
        chown mysql:mysql "$DIR" "$LOG"
      fi
      init_mariadb
      launch mariadbd --no-defaults "${as_root[@]}" --datadir="$DATA" --port="$PORT" \
        --bind-address=127.0.0.1 --socket="$SOCKET" --pid-file="$DIR/mariadbd.pid" \
        --skip-grant-tables --log-error="$LOG" \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci
      ;;
    etcd)
      need etcd etcd-server
      need etcdctl etcd-client
      port_open "$PEER_PORT" && die "127.0.0.1:$PEER_PORT (the peer port) is taken by a process this script did not start ($WHAT)"
      local peer="http://127.0.0.1:$PEER_PORT"
      launch etcd --name leasehold-test --data-dir "$DATA" \
        --listen-client-urls "$(url)" --advertise-client-urls "$(url)" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "leasehold-test=$peer" --logger zap --log-level warn
      ;;
    s3)
      install_moto
      rm -f "$DIR/url"
      launch env INITIAL_NO_AUTH_ACTION_COUNT=3 "$MOTO_VENV/bin/moto_server" -H 127.0.0.1 --port="$PORT"
      ;;
  esac

  deadline=$((SECONDS + 60))
  until answers; do
    if [ -f "$PID_FILE" ] && ! alive "$(head -n 1 "$PID_FILE")"; then
      log_tail
      die "$WHAT exited while starting; see $LOG"
    fi
    if [ "$SECONDS" -gt "$deadline" ]; then
      log_tail
      die "$WHAT did not answer on 127.0.0.1:$PORT within 60 s; see $LOG (it may still be running: scripts/stores.sh stop $NAME $INSTANCE)"
    fi
    sleep 0.2
  done
  pid=$(running_pid) || { log_tail; die "$WHAT answered, but its recorded process is gone; see $LOG"; }
  if [ "$NAME" = mariadb ]; then
    mariadb --no-defaults --socket="$SOCKET" -e 'CREATE DATABASE IF NOT EXISTS leasehold' ||
      die "could not create the database leasehold in $WHAT"
  fi
  [ "$NAME" != s3 ] || setup_s3
  echo "stores.sh: $WHAT started (pid $pid) on 127.0.0.1:$PORT, data $DIR"
}

stop() {
  local pid deadline
  pid=$(running_pid) || { echo "stores.sh: $WHAT not running"; return 0; }
  kill -TERM "$pid"
  deadline=$((SECONDS + 30))
  while alive "$pid"; do
    if [ "$SECONDS" -gt "$deadline" ]; then
      echo "stores.sh: $WHAT (pid $pid) did not stop within 30 s of SIGTERM; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while alive "$pid"; do
        [ "$SECONDS" -le "$deadline" ] || die "$WHAT (pid $pid) survived SIGKILL for 10 s"
        sleep 0.1
      done
      break
    fi
    sleep 0.1
  done
  rm -f "$PID_FILE"
  echo "stores.sh: $WHAT stopped (pid $pid)"
}

case "$COMMAND" in
  start) start ;;
  stop) stop ;;
  restart) stop && start ;;
  status)
    if pid=$(running_pid); then echo "stores.sh: $WHAT running (pid $pid) on 127.0.0.1:$PORT"; else echo "stores.sh: $WHAT not running"; exit 1; fi
    ;;
  url) url ;;
esac
