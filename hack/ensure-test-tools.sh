#!/usr/bin/env bash
# Tools only the test suite needs, from Debian's packages: Chromium for the admin's browser
# test (driven by Playwright for Python with executable_path=/usr/bin/chromium; Playwright's
# own browser download is never used), and iptables for the database's dead-peer test (it
# drops a forwarder's packets), and the OLM bundle validator (below). Idempotent.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if ((${#missing[@]})); then
  echo "[ensure-test-tools] installing Debian's ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The OLM bundle validator (tests/authoring/test_bundle.py), built from the Go module proxy and
# cached by version like the control plane.
bash "$(dirname "${BASH_SOURCE[0]}")/../reconcilers/devstack/build-bundle-validator.sh" >/dev/null
