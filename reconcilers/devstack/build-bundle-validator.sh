#!/usr/bin/env bash
# Build the OLM bundle validator: a small main of this project's own around the
# operator-framework's validation library (github.com/operator-framework/api, the code behind
# `operator-sdk bundle validate`), from the Go module proxy, pinned, cached outside the repo keyed
# by version, as build-control-plane.sh does for the control plane.
#
# Usage of the built binary: bundle-validator [-operatorhub] BUNDLE_DIR
# It prints each error and warning, and exits 1 when there is an error (2 when the directory
# cannot be read as a bundle at all).
#
# Idempotent: when the binary for this version exists, it prints its path and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=go-build.sh
source "$here/go-build.sh"

bin="$cache_root/bundle-validator/$OPERATOR_FRAMEWORK_API_VERSION/bundle-validator"
work="$cache_root/bundle-validator/build-$OPERATOR_FRAMEWORK_API_VERSION"
go_build_begin "$bin" build-bundle-validator "$work"

echo "[build-bundle-validator] building against operator-framework/api" \
  "$OPERATOR_FRAMEWORK_API_VERSION (cold build: a few minutes on 2 cores)" >&2
# The module's own go directive is the lowest Go that builds it.
api_go="$("$GO" mod download -json "github.com/operator-framework/api@$OPERATOR_FRAMEWORK_API_VERSION" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs sed -n 's/^go \(.*\)$/\1/p')"
cat >"$work/go.mod" <<GOMOD
module local/bundle-validator

go $api_go

require github.com/operator-framework/api $OPERATOR_FRAMEWORK_API_VERSION
GOMOD
cat >"$work/main.go" <<'GO'
// Validate an OLM bundle directory (manifests/ and metadata/) with the operator-framework's
// bundle validators, print what they find, and exit 1 on any error.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	operatorHub := flag.Bool("operatorhub", false,
		"also run OperatorHub's checks (provider, maintainers, links, icon, categories)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: bundle-validator [-operatorhub] BUNDLE_DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)

	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR: cannot load the bundle in %s: %v\n", dir, err)
		os.Exit(2)
	}

	// The set `operator-sdk bundle validate` runs by default, plus the capability level's
	// own check (the level must be one OperatorHub knows).
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.ObjectValidator,
		validation.StandardCapabilitiesValidator,
	)
	if *operatorHub {
		validators = validators.WithValidators(
			validation.OperatorHubV2Validator,
			validation.StandardCategoriesValidator,
			validation.GoodPracticesValidator,
		)
	}
	results := validators.Validate(bundle.ObjectsToValidate()...)

	// The loader takes the package and channels from metadata/annotations.yaml; a bundle
	// without them cannot be put in a catalog.
	var extra errors.ManifestResult
	extra.Name = bundle.Name
	if bundle.Package == "" {
		extra.Add(errors.ErrInvalidBundle("metadata/annotations.yaml names no package", bundle.Name))
	}
	if len(bundle.Channels) == 0 || bundle.Channels[0] == "" {
		extra.Add(errors.ErrInvalidBundle("metadata/annotations.yaml names no channel", bundle.Name))
	}
	results = append(results, extra)

	failed := false
	for _, r := range results {
		for _, e := range r.Errors {
			failed = true
			fmt.Printf("ERROR: %s: %s\n", r.Name, e.Error())
		}
		for _, w := range r.Warnings {
			fmt.Printf("WARNING: %s: %s\n", r.Name, w.Error())
		}
	}
	if failed {
		os.Exit(1)
	}
	fmt.Printf("OK: %s (package %s, channels %v)\n", bundle.Name, bundle.Package, bundle.Channels)
}
GO
(cd "$work" && "$GO" build -trimpath -ldflags "-s -w" -o "$work/bundle-validator" .)
go_build_end "$work/bundle-validator"
