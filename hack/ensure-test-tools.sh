#!/usr/bin/env bash
# Tools only the test suite needs, from Debian's packages: Chromium for the admin's browser
# test (driven by Playwright for Python with executable_path=/usr/bin/chromium; Playwright's
# own browser download is never used). Idempotent.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "[ensure-test-tools] installing Debian's chromium" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
