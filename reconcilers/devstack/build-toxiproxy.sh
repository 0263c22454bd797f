#!/usr/bin/env bash
# Build Toxiproxy (the soak's fault proxy: latency, black hole, reset between the operator and
# PostgreSQL, Redis and the api-server) from the Go module proxy, pinned, cached outside the
# repo keyed by version, as build-control-plane.sh does for the control plane.
#
# Idempotent: when the binary for this version exists, it prints its path and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/django-crd-operator}"
bin="$cache_root/toxiproxy/$TOXIPROXY_VERSION/toxiproxy-server"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build-toxiproxy.lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

GO="$("$here/ensure-go.sh")"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"

echo "[build-toxiproxy] building toxiproxy $TOXIPROXY_VERSION" >&2
work="$cache_root/toxiproxy/build-$TOXIPROXY_VERSION"
rm -rf "$work" && mkdir -p "$work" "$(dirname "$bin")"
GOBIN="$work" "$GO" install -trimpath -ldflags "-s -w" \
  "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
mv "$work/server" "$bin"
rm -rf "$work"
echo "$bin"
