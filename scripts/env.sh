# Sourced by Leasehold's scripts: one target directory and one build command for the
# tests, cluster.sh and the benchmarks, so RocksDB's C++ is compiled once.
#
# The target directory lives outside the checkout when the machine allows it, so a
# fresh clone (and CI) reuses the compiled RocksDB.

LEASEHOLD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  if mkdir -p /var/cache/leasehold/target 2>/dev/null && [ -w /var/cache/leasehold/target ]; then
    export CARGO_TARGET_DIR=/var/cache/leasehold/target
  else
    export CARGO_TARGET_DIR="$LEASEHOLD_ROOT/target"
  fi
fi
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
LEASEHOLD_BIN="$CARGO_TARGET_DIR/release"

# Builds every binary and test of the workspace with the release profile: the same
# target and feature selection as `cargo nextest run --release --workspace`, so
# neither rebuilds what the other built.
leasehold_build() {
  (cd "$LEASEHOLD_ROOT" && cargo build --release --workspace --all-targets --locked "$@")
}

# Builds the simulator (simulation/, a workspace of its own so that turmoil's tokio
# features stay out of the binaries above) into the same target directory:
# `$LEASEHOLD_BIN/leasehold-sim` and its tests.
leasehold_build_simulator() {
  (cd "$LEASEHOLD_ROOT/simulation" && cargo build --release --workspace --all-targets --locked "$@")
}
