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
