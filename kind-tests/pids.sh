# Processes a suite started, by name, in the file "$PIDS" (one "name pid"
# line per start; a later line of a name wins). Sourced by cluster.sh and
# node.sh, which set PIDS before calling these.

pid_of() { awk -v n="$1" '$1 == n {p=$2} END {print p}' "$PIDS"; }

stop() { # name: TERM the PID we started under that name, then KILL
  local pid; pid="$(pid_of "$1")"
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
