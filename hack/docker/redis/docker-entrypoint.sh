#!/bin/sh
# As the official redis image: `redis-server` without a config file turns protected mode off
# (the container's network is the boundary) and runs as the redis user.
set -eu
if [ "${1:-}" = redis-server ]; then
  if [ ! -f "${2:-}" ]; then
    set -- "$@" --protected-mode no
  fi
  if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
