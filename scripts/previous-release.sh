#!/usr/bin/env bash
# Builds the previous release's leasehold-server (the commit in
# scripts/previous-release) for the rolling-upgrade test, once per machine, into
# $CARGO_TARGET_DIR/previous-release/COMMIT/, and prints the binary's path.
#
# It builds a git worktree of that commit with the same target directory, the same
# build selection and the same cargo configuration (.cargo/config.toml) as
# leasehold_build, so that only the workspace's own crates compile (RocksDB's C++
# is reused). That build replaces the binaries in
# $CARGO_TARGET_DIR/release: run leasehold_build after it (scripts/test.sh does).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
commit="$(grep -v '^#' "$LEASEHOLD_ROOT/scripts/previous-release" | tr -d '[:space:]')"
out="$CARGO_TARGET_DIR/previous-release/$commit"
if [ -x "$out/leasehold-server" ]; then
  echo "$out/leasehold-server"
  exit 0
fi
if ! git -C "$LEASEHOLD_ROOT" cat-file -e "$commit^{commit}" 2>/dev/null \
  && [ "$(git -C "$LEASEHOLD_ROOT" rev-parse --is-shallow-repository)" = true ]; then
  echo "previous-release.sh: a shallow clone; fetching the history back to $commit" >&2
  git -C "$LEASEHOLD_ROOT" fetch --unshallow --quiet || true
fi
if ! git -C "$LEASEHOLD_ROOT" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous-release.sh: commit $commit is not in this clone's history (a shallow clone? run: git fetch --unshallow)" >&2
  exit 1
fi
# A fixed path, so that a second build (another commit) reuses what the first compiled.
worktree="$CARGO_TARGET_DIR/previous-release/source"
rm -rf "$worktree"
git -C "$LEASEHOLD_ROOT" worktree prune
git -C "$LEASEHOLD_ROOT" worktree add --detach --force "$worktree" "$commit" >/dev/null
cleanup() {
  git -C "$LEASEHOLD_ROOT" worktree remove --force "$worktree" 2>/dev/null || rm -rf "$worktree"
}
trap cleanup EXIT
echo "previous-release.sh: building leasehold-server at $commit (the workspace's crates only)" >&2
# With this checkout's cargo configuration (its rustflags): other flags would make
# cargo compile RocksDB again, and then once more for this checkout's build.
(cd "$worktree" && cargo --config "$LEASEHOLD_ROOT/.cargo/config.toml" build --release --workspace --all-targets \
  --locked) >&2
rm -rf "$out.partial"
mkdir -p "$out.partial"
cp "$CARGO_TARGET_DIR/release/leasehold-server" "$out.partial/leasehold-server"
mv "$out.partial" "$out"
echo "$out/leasehold-server"
