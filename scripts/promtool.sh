#!/usr/bin/env bash
# Prints the path of a promtool (Prometheus' metrics linter, for the /metrics tests): the
# machine's own if it has one, else one unpacked from Debian's prometheus package into
# build/tools. The package is unpacked, not installed: installing it would start a Prometheus
# server on port 9090 wherever systemd runs.
set -euo pipefail
if command -v promtool >/dev/null; then
  command -v promtool
  exit 0
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/tools/prometheus"
if [ ! -x "$dir/usr/bin/promtool" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq >&2
    (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
  fi
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$dir/usr/bin"
  mv "$tmp/x/usr/bin/promtool" "$dir/usr/bin/promtool"
fi
echo "$dir/usr/bin/promtool"
