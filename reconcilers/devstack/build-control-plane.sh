#!/usr/bin/env bash
# Build a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and KWOK (simulated nodes) from the Go module proxy, pinned, and cache
# the binaries outside the repo keyed by version.
#
# Why from source: no container registry or download site is reachable here, but the Go module
# proxy is, and only a real api-server has watch, 410 Gone, CRD validation, the status
# subresource, finalizers, conflicts and garbage collection right.
#
# Idempotent: when the binaries for these versions exist, it prints their directory and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/django-crd-operator}"
bin_dir="$cache_root/control-plane/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION/bin"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

have_all() {
  for b in "${binaries[@]}"; do [ -x "$bin_dir/$b" ] || return 1; done
  [ -s "$bin_dir/kwok-stages.yaml" ] || return 1
  # KWOK is versioned on its own; a new pin rebuilds only it.
  [ "$(cat "$bin_dir/kwok.version" 2>/dev/null)" = "$KWOK_VERSION" ]
}

if have_all; then
  echo "$bin_dir"
  exit 0
fi

# One build at a time per cache (make test and make demo may start together).
mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9
if have_all; then
  echo "$bin_dir"
  exit 0
fi

GO="$("$here/ensure-go.sh")"
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
# sum.golang.org is not reachable directly; the go command reads it through the module proxy.
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"

work="$cache_root/control-plane/build-$KUBERNETES_VERSION-$ETCD_VERSION"
mkdir -p "$work" "$bin_dir"
log() { echo "[build-control-plane] $*" >&2; }

# --- Kubernetes: a wrapper module that replaces each staging module with its v0.Y.Z release ---
k8s_mod="$work/kubernetes"
mkdir -p "$k8s_mod"
staging_version="v0.${KUBERNETES_VERSION#v1.}"
upstream_mod="$("$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
{
  echo "module local/kubernetes-build"
  echo
  echo "go $(sed -n 's/^go \(.*\)$/\1/p' "$upstream_mod")"
  echo
  echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
  echo
  echo "replace ("
  # Upstream points every staging module at ./staging/src/...; those directories are not in
  # the module zip, so each one is pinned to the release published from the same tag.
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$upstream_mod" | sort -u |
    while read -r m; do echo "	$m => $m $staging_version"; done
  echo ")"
} >"$k8s_mod/go.mod"
cat >"$k8s_mod/tools.go" <<'EOF'
//go:build tools

package tools
EOF

ldflags_pkg="k8s.io/component-base/version"
git_major="${KUBERNETES_VERSION#v}"; git_major="${git_major%%.*}"
git_minor="${KUBERNETES_VERSION#v*.}"; git_minor="${git_minor%%.*}"
ldflags="-s -w \
  -X $ldflags_pkg.gitVersion=$KUBERNETES_VERSION \
  -X $ldflags_pkg.gitMajor=$git_major \
  -X $ldflags_pkg.gitMinor=$git_minor \
  -X $ldflags_pkg.gitTreeState=clean \
  -X $ldflags_pkg.buildDate=1970-01-01T00:00:00Z \
  -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"

for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ ! -x "$bin_dir/$cmd" ]; then
    log "building $cmd $KUBERNETES_VERSION (cold build: several minutes on 2 cores)"
    (cd "$k8s_mod" && "$GO" build -trimpath -ldflags "$ldflags" -o "$bin_dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$bin_dir/$cmd.tmp" "$bin_dir/$cmd"
  fi
done

# --- etcd: upstream server/go.mod has relative replaces, so wrap etcdmain.Main ourselves ---
etcd_mod="$work/etcd"
mkdir -p "$etcd_mod"
cat >"$etcd_mod/go.mod" <<EOF
module local/etcd-build

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
cat >"$etcd_mod/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
if [ ! -x "$bin_dir/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  (cd "$etcd_mod" && "$GO" build -trimpath -ldflags "-s -w" -o "$bin_dir/etcd.tmp" .)
  mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
fi

# --- KWOK: a module of its own without replace directives, so `go install` builds it ---
if [ "$(cat "$bin_dir/kwok.version" 2>/dev/null)" != "$KWOK_VERSION" ] || [ ! -x "$bin_dir/kwok" ] \
   || [ ! -s "$bin_dir/kwok-stages.yaml" ]; then
  log "building kwok $KWOK_VERSION"
  rm -rf "$work/kwok-bin" && mkdir -p "$work/kwok-bin"
  GOBIN="$work/kwok-bin" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$work/kwok-bin/kwok" "$bin_dir/kwok"
  # The stages kwokctl uses by default: nodes become Ready and keep their Lease, Pods on them
  # become Running/Ready (and complete or go away as kubelet would let them).
  stages="$("$GO" env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$stages/$f"; echo "---"
  done >"$bin_dir/kwok-stages.yaml"
  echo "$KWOK_VERSION" >"$bin_dir/kwok.version"
fi

have_all
echo "$bin_dir"
