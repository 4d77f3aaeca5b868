#!/usr/bin/env bash
# Runs every Leasehold test: the state machine's table, property and scenario tests
# and the other unit tests; real-process cluster tests (replication, sessions, locks,
# semaphores, elections, trust, metrics, bad configurations, the CLI and its exit
# codes); the fault suite's short runs, a rolling upgrade from the previous release
# among them; the benchmark tool's smoke test; the payments stories against a real
# PostgreSQL; every fenced-write adapter against its real store (PostgreSQL, SQLite,
# MariaDB, Redis, etcd, HTTP); the documentation examples; and the Python client's
# tests against real clusters and stores, the status page's in headless Chromium
# among them; and blocks of seeds of the simulator. Installs what it needs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$LEASEHOLD_ROOT/scripts/setup.sh"
cd "$LEASEHOLD_ROOT"
echo "test.sh: target directory $CARGO_TARGET_DIR"
# The rolling-upgrade test starts a cluster on the previous release's build: built
# once per machine (the workspace's crates only), before this checkout's build, which
# it would otherwise replace in the target directory.
LEASEHOLD_PREVIOUS_SERVER="$("$LEASEHOLD_ROOT/scripts/previous-release.sh")"
export LEASEHOLD_PREVIOUS_SERVER
# Build first, with the same selection the test run uses, so the run below only runs.
leasehold_build
leasehold_build_simulator
# The payments example and the fenced-write adapters are tested against real
# stores: private instances on 127.0.0.1 (scripts/stores.sh: PostgreSQL 15432,
# MariaDB 13306, Redis 16379, etcd 12379, S3 19000 (moto, installed from PyPI on
# first use)), stopped again at the end if this run started them.
started_stores=()
stop_stores() {
  local name
  for name in "${started_stores[@]}"; do
    "$LEASEHOLD_ROOT/scripts/stores.sh" stop "$name" || true
  done
}
trap stop_stores EXIT
for name in postgres mariadb redis etcd s3; do
  if ! "$LEASEHOLD_ROOT/scripts/stores.sh" status "$name" >/dev/null; then
    "$LEASEHOLD_ROOT/scripts/stores.sh" start "$name"
    started_stores+=("$name")
  fi
done
LEASEHOLD_TEST_DATABASE_URL="$("$LEASEHOLD_ROOT/scripts/postgres.sh" url)"
export LEASEHOLD_TEST_DATABASE_URL
status=0
# nextest does not run documentation examples; cargo test does, with the same profile.
if [ "$#" -eq 0 ]; then
  cargo test --release --workspace --locked --doc || status=$?
fi
cargo nextest run --release --workspace --locked --no-fail-fast "$@" || status=$?
# The simulator's own workspace: its tests (the summary, the controls, replays).
if [ "$#" -eq 0 ]; then
  (cd simulation && cargo nextest run --release --workspace --locked --no-fail-fast) || status=$?
fi
# The simulator (simulation/README.md): a fixed block of seeds, then a block from a
# first seed drawn at random and printed; any failing seed is named and replays with
# `leasehold-sim run --seed S`.
if [ "$#" -eq 0 ]; then
  "$LEASEHOLD_BIN/leasehold-sim" run --seeds 100 --first-seed 1 || status=$?
  "$LEASEHOLD_BIN/leasehold-sim" run --seeds 50 || status=$?
fi
# The Python client (clients/python), installed as a user installs it, in a virtual
# environment beside the target directory, and its pytest suite against real clusters
# of the binaries built above (with the status page's browser test, which drives
# Debian's chromium through chromium-driver with selenium).
if [ "$#" -eq 0 ]; then
  venv="$CARGO_TARGET_DIR/python-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "$LEASEHOLD_ROOT/clients/python[test]"
  (cd "$LEASEHOLD_ROOT/clients/python" && LEASEHOLD_BIN_DIR="$LEASEHOLD_BIN" "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider tests) || status=$?
fi
exit "$status"
