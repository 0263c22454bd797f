"""``manage.py watch`` as a process: what it does with the interpreter before it watches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_watcher_freezes_its_start_up_heap_and_keeps_the_collector_on():
    """What Django's set-up made lives as long as the watcher: frozen, so no full collection
    walks it again; the collector stays on for everything made after, or a long-running
    watcher would never free a reference cycle. Any project's ``manage.py`` gets it."""
    script = (
        "import gc, django; django.setup(); "
        "from django.core.management import execute_from_command_line; "
        "from reconcilers.management.commands import watch; "
        "print('before', gc.get_freeze_count()); "
        "watch.Command.handle = lambda self, *a, **o: print("
        "'handle', gc.isenabled(), gc.get_freeze_count() > 10_000); "
        "execute_from_command_line(['manage.py', 'watch', '--skip-checks'])")
    env = {**os.environ,
           "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == ["before 0", "handle True True"], proc.stdout

