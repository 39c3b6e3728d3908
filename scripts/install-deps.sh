#!/usr/bin/env bash
# Installs the Debian 12 packages idemsaga builds and tests with, if any is missing, plus any
# package named as an argument (scripts/test adds chromium). Used by scripts/dev, scripts/test,
# bench/run.sh and .ci/run, so a fresh machine needs nothing else. Runs as root or with sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libpqxx-dev libcpp-httplib-dev nlohmann-json3-dev libboost-dev libcli11-dev libssl-dev
  libjemalloc-dev librabbitmq-dev libhiredis-dev
  libgtest-dev libgmock-dev
  postgresql-15 postgresql-client-15
  curl util-linux
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# Debian's postgresql-15 creates a `main` cluster on port 5432 when it is installed (and
# starts it where systemd runs); idemsaga runs clusters of its own and never uses it. Say so
# before the package is installed, unless this machine's configuration already decides. A
# file in createcluster.d, which Debian's createcluster.conf includes, leaves that conffile
# as the package ships it (no upgrade prompts); an older createcluster.conf that includes
# nothing gets the line itself.
if [[ " ${missing[*]} " == *" postgresql-15 "* ]]; then
  conf=/etc/postgresql-common/createcluster.conf
  conf_d=/etc/postgresql-common/createcluster.d
  if ! grep -Eqs '^[[:space:]]*create_main_cluster[[:space:]]*=' "$conf" "$conf_d"/*.conf; then
    target=$conf_d/idemsaga.conf
    if [ -e "$conf" ] && ! grep -Eqs "^[[:space:]]*include_dir[[:space:]]*=?[[:space:]]*'$conf_d'" "$conf"; then
      target=$conf
    fi
    echo "install-deps: create_main_cluster = false in $target (no system cluster on 5432)"
    "${sudo_cmd[@]}" mkdir -p "$(dirname "$target")"
    printf '# idemsaga runs private clusters; no system cluster on 5432.\ncreate_main_cluster = false\n' |
      "${sudo_cmd[@]}" tee -a "$target" >/dev/null
  fi
fi

echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
