#!/usr/bin/env bash
# Create .venv and install requirements-dev.lock (the image's packages and the test tools) into
# it; a no-op when the lock has not changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python="${PYTHON:-python3}"
stamp=".venv/.lock-$(sha256sum requirements-dev.lock | cut -c1-16)"
[ -f "$stamp" ] && exit 0

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "Python 3.11+ is required (what CI runs); found $("$python" --version)" >&2
  exit 1
fi
if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3-venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.lock
# pip only adds: a package the lock has dropped since would stay, and some change what others do
# by being there (redis-py uses hiredis's parser whenever hiredis is importable). Remove them.
.venv/bin/python - <<'PY'
import re
import subprocess
import sys
from importlib.metadata import distributions


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


locked = {norm(re.split(r"[=<>;\s\[]", line, maxsplit=1)[0])
          for line in open("requirements-dev.lock") if re.match(r"[A-Za-z0-9]", line)}
keep = locked | {"pip", "setuptools", "wheel", "django-crd-operator"}
extra = sorted({norm(d.metadata["Name"]) for d in distributions()} - keep)
if extra:
    print("removing packages the lock no longer names:", " ".join(extra))
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *extra],
                   check=True)
PY
rm -f .venv/.lock-* && touch "$stamp"
