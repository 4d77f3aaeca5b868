#!/usr/bin/env bash
# A private PostgreSQL for the tests of examples/payments, on 127.0.0.1 only.
#
#   scripts/postgres.sh start    initialise (once) and start it; wait until it answers
#   scripts/postgres.sh stop     stop it (the postmaster's recorded process id)
#   scripts/postgres.sh restart  stop it, then start it on the same data
#   scripts/postgres.sh status   exit 0 when it is running
#   scripts/postgres.sh url      print the URL the tests use (LEASEHOLD_TEST_DATABASE_URL)
#
# Its data directory is /var/cache/leasehold/postgres when that is writable (shared by
# every checkout on the machine, like the target directory), else .postgres/ in the
# checkout; LEASEHOLD_POSTGRES_DIR overrides it. Port 15432 (LEASEHOLD_POSTGRES_PORT),
# trust authentication for 127.0.0.1, no Unix socket. It runs as the `postgres` user
# when started by root (initdb refuses root), else as the caller. A throwaway instance:
# fsync is off.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

PORT="${LEASEHOLD_POSTGRES_PORT:-15432}"
if [ -n "${LEASEHOLD_POSTGRES_DIR:-}" ]; then
  BASE="$LEASEHOLD_POSTGRES_DIR"
elif mkdir -p /var/cache/leasehold/postgres 2>/dev/null && [ -w /var/cache/leasehold/postgres ]; then
  BASE=/var/cache/leasehold/postgres
else
  BASE="$LEASEHOLD_ROOT/.postgres"
fi
DATA="$BASE/data"
LOG="$BASE/postgres.log"

die() { echo "postgres.sh: $*" >&2; exit 1; }

bin_dir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$dir" ] && [ -x "$dir/initdb" ] ||
    die "PostgreSQL's server programs are missing; run scripts/setup.sh (apt-get install postgresql)"
  echo "$dir"
}

# Runs a command as the database's owner.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# The postmaster's process id, if the one recorded in the data directory runs.
running_pid() {
  local pid
  [ -f "$DATA/postmaster.pid" ] || return 1
  pid=$(head -n 1 "$DATA/postmaster.pid")
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  # A stale file after a reboot can name a process id that something else now has.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] || return 1
  echo "$pid"
}

url() { echo "postgres://postgres@127.0.0.1:$PORT/postgres"; }

start() {
  local bin pid
  bin=$(bin_dir)
  if pid=$(running_pid); then
    echo "postgres.sh: running (pid $pid) on 127.0.0.1:$PORT, data $DATA"
    return 0
  fi
  mkdir -p "$BASE"
  [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$BASE"
  chmod 700 "$BASE"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    echo "postgres.sh: initialising $DATA"
    as_owner "$bin/initdb" --pgdata "$DATA" --username postgres --auth trust \
      --encoding UTF8 --locale C >"$BASE/initdb.log" 2>&1 ||
      die "initdb failed; see $BASE/initdb.log"
    cat >>"$DATA/postgresql.conf" <<EOF

# scripts/postgres.sh: a private, throwaway instance for the tests.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = ''
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  fi
  # The port on the command line wins over the one written at initialisation.
  as_owner "$bin/pg_ctl" --pgdata "$DATA" --log "$LOG" --wait --timeout 60 -o "-p $PORT" start >/dev/null ||
    die "PostgreSQL did not start; see $LOG"
  pid=$(running_pid) || die "PostgreSQL exited right after starting; see $LOG"
  echo "postgres.sh: started (pid $pid) on 127.0.0.1:$PORT, data $DATA"
}

stop() {
  local pid
  pid=$(running_pid) || { echo "postgres.sh: not running"; return 0; }
  # SIGINT is PostgreSQL's fast shutdown: roll back open transactions and exit.
  kill -INT "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { echo "postgres.sh: stopped (pid $pid)"; return 0; }
    sleep 0.1
  done
  die "PostgreSQL (pid $pid) did not stop within 10 s; see $LOG"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop && start ;;
  status)
    if pid=$(running_pid); then echo "postgres.sh: running (pid $pid) on 127.0.0.1:$PORT"; else echo "postgres.sh: not running"; exit 1; fi
    ;;
  url) url ;;
  *) echo "usage: $0 start|stop|restart|status|url" >&2; exit 2 ;;
esac
