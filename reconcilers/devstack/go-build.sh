# Sourced by the scripts that build one Go binary from the Go module proxy, pinned and cached
# outside the repo keyed by version (build-bundle-validator.sh, build-toxiproxy.sh); not run on
# its own. The caller sets `here` (this directory) first. A caller reads:
#
#   go_build_begin BIN LOCK WORK   BIN built already: print it and end the calling script.
#                                  Else take the cache's lock LOCK (one build of it at a time:
#                                  make test and make demo may start together), look again
#                                  (the build it waited for may have made BIN), set GO and the
#                                  build's environment, and empty the build directory WORK.
#   go_build_end BUILT             move BUILT to BIN, drop WORK, print BIN.
#
# The cache's paths are the callers': a built binary stays valid as long as its path does.

# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/django-crd-operator}"

go_build_begin() {
  go_bin="$1" go_work="$3"
  if [ -x "$go_bin" ]; then
    echo "$go_bin"
    exit 0
  fi
  mkdir -p "$cache_root"
  exec 9>"$cache_root/.$2.lock"
  flock 9
  if [ -x "$go_bin" ]; then
    echo "$go_bin"
    exit 0
  fi

  GO="$("$here/ensure-go.sh")"
  export GOFLAGS="-mod=mod -buildvcs=false"
  export CGO_ENABLED=0
  # sum.golang.org is not reachable directly; the go command reads it through the module proxy.
  export GOPROXY="${GOPROXY:-https://proxy.golang.org}"

  rm -rf "$go_work" && mkdir -p "$go_work" "$(dirname "$go_bin")"
}

go_build_end() {
  mv "$1" "$go_bin"
  rm -rf "$go_work"
  echo "$go_bin"
}
