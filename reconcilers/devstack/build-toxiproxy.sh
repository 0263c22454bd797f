#!/usr/bin/env bash
# Build Toxiproxy (the soak's fault proxy: latency, black hole, reset between the operator and
# PostgreSQL, Redis and the api-server) from the Go module proxy, pinned, cached outside the
# repo keyed by version, as build-control-plane.sh does for the control plane.
#
# Idempotent: when the binary for this version exists, it prints its path and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=go-build.sh
source "$here/go-build.sh"

bin="$cache_root/toxiproxy/$TOXIPROXY_VERSION/toxiproxy-server"
work="$cache_root/toxiproxy/build-$TOXIPROXY_VERSION"
go_build_begin "$bin" build-toxiproxy "$work"

echo "[build-toxiproxy] building toxiproxy $TOXIPROXY_VERSION" >&2
GOBIN="$work" "$GO" install -trimpath -ldflags "-s -w" \
  "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
go_build_end "$work/server"
