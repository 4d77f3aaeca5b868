#!/usr/bin/env bash
# Installs what building and testing Leasehold needs on Debian 12, and nothing else.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need_apt=()
have_package() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for package in libclang-dev build-essential pkg-config nftables iproute2 util-linux procps postgresql \
  redis-server mariadb-server etcd-server etcd-client chromium chromium-driver python3 python3-venv; do
  have_package "$package" || need_apt+=("$package")
done

if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is missing; install Rust 1.88 or newer (https://rustup.rs) and run again" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install cargo-nextest --locked
fi
