#!/usr/bin/env bash
# Create .venv and install requirements-dev.lock (the image's packages and the test tools) into
# it; a no-op when the lock has not changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python="${PYTHON:-python3}"
stamp=".venv/.lock-$(sha256sum requirements-dev.lock | cut -c1-16)"
[ -f "$stamp" ] && exit 0

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "Python 3.10+ is required (Django 5.2 LTS); found $("$python" --version)" >&2
  exit 1
fi
if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3-venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.lock
rm -f .venv/.lock-* && touch "$stamp"
