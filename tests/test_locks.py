"""The two locks: the image's is complete, universal and hashed; the dev lock agrees with it.

The image installs requirements.lock with ``--require-hashes --no-deps``, so a package missing
from it, or one without a hash, fails the image build - these catch that before Docker does.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def _requirements(path: Path) -> dict[str, tuple[Requirement, list[str]]]:
    """name -> (requirement, its hashes), joining the backslash-continued lines."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        hashes = re.findall(r"--hash=(\S+)", line)
        req = Requirement(re.sub(r"\s*--hash=\S+", "", line))
        found[req.name.lower().replace("_", "-")] = (req, hashes)
    return found


def test_every_package_of_the_image_lock_is_pinned_and_hashed():
    lock = _requirements(REPO / "requirements.lock")
    assert lock
    for name, (req, hashes) in lock.items():
        assert str(req.specifier).startswith("=="), f"{name} is not pinned: {req}"
        assert hashes and all(h.startswith("sha256:") for h in hashes), f"{name} has no hash"


def test_the_image_lock_holds_what_older_pythons_3_11_need():
    """bookworm's Python 3.11.2 needs redis' async-timeout; a lock frozen on a newer 3.11 lacks it."""
    req, _ = _requirements(REPO / "requirements.lock")["async-timeout"]
    assert req.marker is not None
    assert req.marker.evaluate({"python_full_version": "3.11.2"})
    assert not req.marker.evaluate({"python_full_version": "3.11.7"})


def test_the_locks_pin_every_direct_dependency_and_agree():
    lock = _requirements(REPO / "requirements.lock")
    dev = _requirements(REPO / "requirements-dev.lock")
    for name, (req, _) in _requirements(REPO / "requirements.in").items():
        assert lock[name][0].specifier == req.specifier, name
    for name, (req, _) in lock.items():
        assert dev[name][0].specifier == req.specifier, f"{name}: the dev lock pins another version"
    assert not {"pytest", "pytest-django", "playwright"} & lock.keys()
