# shellcheck shell=bash
# Shared helpers for the service scripts in scripts/services/ (sourced, not executed).
# Each service keeps its state in "$(svc_dir NAME)": a pid file, an env file (KEY=VALUE lines), its config,
# its data and its log. See docs/services.md.

SVC_ROOT="${SLUICE_SERVICES_DIR:-/tmp/sluice-services-${USER:-$(id -un)}}"
# shellcheck disable=SC2034 # used by the service scripts
SVC_CACHE="${SLUICE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}"

svc_log() { echo "[services] $*" >&2; }
svc_die() { echo "[services] error: $*" >&2; exit 1; }

# svc_dir NAME: the state directory of a service.
svc_dir() { echo "$SVC_ROOT/$1"; }

# svc_free_port: prints a TCP port that was free on 127.0.0.1 a moment ago (the kernel picks it).
svc_free_port() {
  python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# svc_port_open PORT: exit 0 when something accepts TCP connections on 127.0.0.1:PORT.
svc_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# svc_pid NAME: prints the pid of the running service and exits 0, or exits 1 when it is not running.
# A pid is believed only when that process's command line still mentions the service's state dir, so a
# stale pid file whose number was reused by another process does not count.
svc_pid() {
  local dir pidfile pid
  dir="$(svc_dir "$1")"
  pidfile="$dir/pid"
  [ -s "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir" || return 1
  echo "$pid"
}

# svc_running NAME: exit 0 when the service is running.
svc_running() { svc_pid "$1" >/dev/null; }

# svc_launched_alive NAME: exit 0 while the process this script just launched (its pid file) is alive and not a
# zombie. Unlike svc_pid it does not look at the command line: right after `cmd &` the child may not have
# exec'd yet, and its command line is still this script's (a start once failed in CI on that race).
svc_launched_alive() {
  local pidfile pid state
  pidfile="$(svc_dir "$1")/pid"
  [ -s "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != "Z" ]
}

# svc_lock NAME: serialises start/stop of one service across processes (held until the shell exits).
svc_lock() {
  mkdir -p "$SVC_ROOT"
  exec 9>"$SVC_ROOT/.$1.lock"
  flock -w 300 9 || svc_die "timed out waiting for the lock of $1"
}

# svc_log_tail NAME [LOGFILE]: prints the last 50 lines of a service's log to stderr.
svc_log_tail() {
  local log="${2:-$(svc_dir "$1")/$1.log}"
  if [ -f "$log" ]; then
    echo "----- last 50 lines of $log -----" >&2
    tail -n 50 "$log" >&2
    echo "----- end of $log -----" >&2
  else
    echo "(no log at $log)" >&2
  fi
}

# svc_wait_ready NAME DEADLINE_SECONDS CMD...: runs CMD every half second until it succeeds. Fails (after
# printing the log tail) when the deadline passes or the service's process dies.
svc_wait_ready() {
  local name="$1" deadline_s="$2"
  shift 2
  local end=$((SECONDS + deadline_s))
  while :; do
    if ! svc_launched_alive "$name"; then
      svc_log "$name exited before it became ready"
      svc_log_tail "$name"
      return 1
    fi
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if [ "$SECONDS" -ge "$end" ]; then
      svc_log "$name was not ready after ${deadline_s}s (probe: $*)"
      svc_log_tail "$name"
      return 1
    fi
    sleep 0.5
  done
}

# svc_stop NAME [GRACE_SECONDS]: SIGTERM, wait up to GRACE_SECONDS (default 30), then SIGKILL; waits until gone.
svc_stop() {
  local name="$1" grace="${2:-30}" pid end
  if ! pid="$(svc_pid "$name")"; then
    rm -f "$(svc_dir "$name")/pid"
    svc_log "$name is not running"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  end=$((SECONDS + grace))
  while [ -d "/proc/$pid" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  if [ -d "/proc/$pid" ]; then
    svc_log "$name (pid $pid) still alive after ${grace}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while [ -d "/proc/$pid" ]; do sleep 0.1; done
  fi
  rm -f "$(svc_dir "$name")/pid"
  svc_log "$name stopped (pid $pid)"
}

# svc_env NAME: prints the service's KEY=VALUE lines; fails when it is not running.
svc_env() {
  svc_running "$1" || svc_die "$1 is not running (start it with scripts/services/$1 start)"
  cat "$(svc_dir "$1")/env"
}

# svc_status NAME: prints a line and exits 0 when running, 1 when not.
svc_status() {
  local pid
  if pid="$(svc_pid "$1")"; then
    echo "$1 running (pid $pid, state $(svc_dir "$1"))"
    return 0
  fi
  echo "$1 not running"
  return 1
}
