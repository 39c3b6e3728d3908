#!/usr/bin/env bash
# Installs the Debian 12 packages idemsaga builds and tests with, if any is missing.
# Used by scripts/dev, scripts/test and .ci/run, so a fresh machine needs nothing else.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libpqxx-dev libcpp-httplib-dev nlohmann-json3-dev libboost-dev libcli11-dev libssl-dev
  libgtest-dev libgmock-dev
  postgresql-15 postgresql-client-15
  curl util-linux
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  # The postgresql package would start a system cluster on 5432; idemsaga runs its own.
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
