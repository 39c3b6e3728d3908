# shellcheck shell=bash
# Shared by the peers' start/stop scripts (restate/peer.sh, dbos/peer.sh); sourced, not run.
# wait_for WHAT SECONDS CMD...: runs CMD every 0.25 s until it succeeds (0) or SECONDS pass (1).
wait_for() {
  local what=$1 seconds=$2 i
  shift 2
  for ((i = 0; i < seconds * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "peer: $what not ready within ${seconds} s" >&2
  return 1
}
# stop_pids DIR: TERM to each PID in DIR/pids (the ones `start` wrote), KILL after 15 s.
stop_pids() {
  local pid i
  [ -f "$1/pids" ] || return 0
  while read -r pid; do kill -TERM "$pid" 2>/dev/null || true; done <"$1/pids"
  while read -r pid; do
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  done <"$1/pids"
  rm -f "$1/pids"
}
# fail DIR LOG: shows the log's tail, stops what was started, exits 1.
fail() {
  tail -n 30 "$1/$2" >&2 || true
  stop_pids "$1"
  exit 1
}
# peer_begin CMD DIR: `stop` stops what `start` started in DIR and exits; `start` checks that
# bench/peers is installed, makes DIR and an empty DIR/pids, and returns (the caller starts).
# Sets NODE (Node 22 from bench/peers/node_modules).
peer_begin() {
  NODE=$PEERS/node_modules/node/bin/node
  case "$1" in
    stop)
      stop_pids "$2"
      exit 0
      ;;
    start) ;;
    *)
      echo "peer.sh: unknown command $1 (usage: peer.sh start|stop DIR)" >&2
      exit 2
      ;;
  esac
  if [ ! -x "$NODE" ]; then
    echo "peer.sh: bench/peers is not installed (bench/peers/install.sh)" >&2
    exit 1
  fi
  mkdir -p "$2"
  : >"$2/pids"
}
