#!/usr/bin/env bash
# A running Docker engine for the compose path and its end-to-end test: installs Debian's
# docker.io, docker-compose (v1.29) and debootstrap when missing, starts dockerd in the background
# when nothing answers, and waits until `docker info` works. Safe to run again: a running engine
# is left alone. Needs root (apt-get, dockerd).
set -euo pipefail

cache="${OPERATOR_CACHE_DIR:-$HOME/.cache/django-crd-operator}"
log="$cache/dockerd.log"
timeout="${OPERATOR_DOCKER_START_TIMEOUT:-90}"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "docker-engine: missing ${missing[*]}; run as root or apt-get install them" >&2
    exit 1
  fi
  echo "docker-engine: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

docker info >/dev/null 2>&1 && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "docker-engine: no Docker engine answers and only root can start dockerd" >&2
  exit 1
fi
# A pid file whose number now belongs to another program is stale: the engine it named was
# killed without cleaning up (a runner reset, a host crash) and the number was reused. dockerd
# trusts these files - it refuses to start over its own, and over its containerd's it waits for
# a containerd that is not there - so remove them; a file naming a live engine stays.
clear_stale_pidfile() {
  local pidfile="$1" program="$2" pid
  [ -f "$pidfile" ] || return 0
  pid="$(tr -dc 0-9 < "$pidfile")"
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$program" ]; then
    return 0
  fi
  echo "docker-engine: removing stale $pidfile (pid ${pid:-none} is not $program)" >&2
  rm -f "$pidfile"
}
clear_stale_pidfile /var/run/docker.pid dockerd
clear_stale_pidfile /var/run/docker/containerd/containerd.pid containerd

mkdir -p "$cache"
# Detached in its own session so the engine outlives this script and the test that ran it.
setsid dockerd >>"$log" 2>&1 < /dev/null &
pid=$!
for _ in $(seq "$timeout"); do
  docker info >/dev/null 2>&1 && exit 0
  if ! kill -0 "$pid" 2>/dev/null; then
    break
  fi
  sleep 1
done
echo "docker-engine: dockerd did not become ready within ${timeout}s (log: $log)" >&2
tail -n 30 "$log" >&2 || true
exit 1
