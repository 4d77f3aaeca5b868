#!/usr/bin/env bash
# Runs every Leasehold test: unit and property tests, in-process and real-process
# cluster tests, the CLI tests and the fenced-write stories. Installs what it needs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$LEASEHOLD_ROOT/scripts/setup.sh"
cd "$LEASEHOLD_ROOT"
echo "test.sh: target directory $CARGO_TARGET_DIR"
# Build first, with the same selection the test run uses, so the run below only runs.
leasehold_build
exec cargo nextest run --release --workspace --locked --no-fail-fast "$@"
