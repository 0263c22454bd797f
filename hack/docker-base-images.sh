#!/usr/bin/env bash
# Stand-ins for the official base images the project's Dockerfile and docker-compose.yml name,
# for machines that reach Debian's package mirror and PyPI but no container registry:
#
#   python:3.11-slim  Debian bookworm's python3 (3.11), venv and pip; python/python3/pip on PATH
#   postgres:17       Debian trixie's postgresql-17, honouring POSTGRES_USER/PASSWORD/DB, PGDATA
#   redis:7           Debian bookworm's redis-server (7.0)
#
# Each is built from a debootstrap rootfs cached outside the repository
# (${OPERATOR_CACHE_DIR:-~/.cache/django-crd-operator}/docker/) and labelled with a hash of what
# went into it. A tag that already exists with the same hash, or without our label (a real
# official image), is left alone, so a second run does nothing. Needs root and a running engine
# (hack/docker-engine.sh). Usage: hack/docker-base-images.sh [python|postgres|redis ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache="${OPERATOR_CACHE_DIR:-$HOME/.cache/django-crd-operator}/docker"
mirror="${OPERATOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ca_bundle="${OPERATOR_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
label=org.django-crd-operator.standin
export DOCKER_BUILDKIT=0  # the Dockerfiles need nothing newer; works with docker.io's engine

declare -A tag=([python]=python:3.11-slim [postgres]=postgres:17 [redis]=redis:7)
declare -A suite=([python]=bookworm [postgres]=trixie [redis]=bookworm)

log() { echo "docker-base-images: $*" >&2; }
label_of() { docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$1" 2>/dev/null; }

# The debootstrap rootfs of a suite as a local image; the tarball is cached, the import is cheap.
rootfs_image() {
  local suite=$1
  local tarball="$cache/debootstrap-$suite-minbase.tar"
  local image="django-crd-operator/rootfs:$suite-minbase"
  if [ ! -s "$tarball" ]; then
    local dir="$cache/debootstrap-$suite.tmp"
    rm -rf "$dir" && mkdir -p "$dir"
    log "debootstrap $suite (minbase) from $mirror"
    local start=$SECONDS
    debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$cache/debootstrap-$suite.log" 2>&1 \
      || { tail -n 20 "$cache/debootstrap-$suite.log" >&2; exit 1; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
    log "debootstrap $suite took $((SECONDS - start))s"
  fi
  local key
  key=$(stat -c '%s-%Y' "$tarball")
  if [ "$(label_of "$image")" != "$key" ]; then
    docker import --change "LABEL $label=$key" --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["bash"]' "$tarball" "$image" >/dev/null
  fi
  echo "$image"
}

build() {
  local name=$1 context="hack/docker/$1"
  local key
  key=$( { echo "${suite[$name]}"; cat "$context"/*; cat "$ca_bundle"; } | sha256sum | cut -c1-16)
  local have
  if have=$(label_of "${tag[$name]}"); then
    case "$have" in
      "$key") return 0 ;;
      "" | "<no value>") log "${tag[$name]} exists and is not a stand-in; leaving it"; return 0 ;;
    esac
  fi
  local base start=$SECONDS build_dir="$cache/context-$name"
  base=$(rootfs_image "${suite[$name]}")
  # The build context: the Dockerfile and scripts, plus this machine's CA bundle.
  rm -rf "$build_dir" && mkdir -p "$build_dir"
  cp -r "$context"/. "$build_dir"/ && cp "$ca_bundle" "$build_dir/ca-certificates.crt"
  log "building ${tag[$name]} from $base"
  docker build --network host --build-arg "BASE_IMAGE=$base" --label "$label=$key" \
    -t "${tag[$name]}" "$build_dir" >"$cache/build-$name.log" 2>&1 \
    || { tail -n 30 "$cache/build-$name.log" >&2; exit 1; }
  log "${tag[$name]} built in $((SECONDS - start))s"
}

mkdir -p "$cache"
names=("$@")
[ "${#names[@]}" -gt 0 ] || names=(python postgres redis)
for name in "${names[@]}"; do
  [ -n "${tag[$name]:-}" ] || { log "unknown image $name (python, postgres, redis)"; exit 2; }
  build "$name"
done
