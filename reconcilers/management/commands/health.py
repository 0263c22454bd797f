"""Exit 0 when this container's role is healthy, 1 (with the reason) when not.

``health web``: GET /healthz of the local gunicorn (``WEB_BIND``, default 127.0.0.1:8000).
``health worker``: a Celery control ping to this container's worker node (``--node`` to name it).
``health watcher``: the watcher's heartbeat in Redis is fresh (``--pid`` to name the process).
Used by docker-compose.yml's healthchecks; each role's check lives in its wing's ``health``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from reconcilers._base.conf import process_setting
from reconcilers._base.probes import CheckResult
from reconcilers._run import health as worker
from reconcilers._watch import health as watcher
from reconcilers._web import health as web


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("role", choices=["web", "worker", "watcher"])
        parser.add_argument("--timeout", type=float, default=None,
                            help="seconds to wait (default OPERATOR_HEALTH_TIMEOUT)")
        parser.add_argument("--node", help="worker: the Celery node name to ping")
        parser.add_argument("--pid", type=int, help="watcher: the watcher's process id")
        parser.add_argument("--max-age", type=float, default=None,
                            help="watcher: heartbeat age limit (OPERATOR_HEALTH_WATCHER_MAX_AGE)")

    def handle(self, *args, role: str, timeout: float | None, **options) -> None:
        timeout = process_setting("OPERATOR_HEALTH_TIMEOUT", 3.0) if timeout is None else timeout
        result = getattr(self, f"check_{role}")(timeout, **options)
        if not result.ok:
            raise CommandError(f"{role} unhealthy: {result.error}")
        self.stdout.write(f"{role} healthy ({result.ms} ms)")

    def check_web(self, timeout: float, **options) -> CheckResult:
        return web.probe_web(timeout)

    def check_worker(self, timeout: float, node: str | None, **options) -> CheckResult:
        nodes = [node] if node else worker.local_worker_nodes()
        if len(nodes) != 1:
            return CheckResult(False, 0.0, f"expected one local worker, found {nodes}; "
                                           "name it with --node")
        return worker.ping_worker(nodes[0], timeout)

    def check_watcher(self, timeout: float, pid: int | None, max_age: float | None,
                      **options) -> CheckResult:
        pids = [pid] if pid else watcher.local_watcher_pids()
        if len(pids) != 1:
            return CheckResult(False, 0.0, f"expected one local `manage.py watch`, found "
                                           f"pids {pids}; name it with --pid")
        limit = (process_setting("OPERATOR_HEALTH_WATCHER_MAX_AGE", 30.0) if max_age is None
                 else max_age)
        return watcher.watcher_heartbeat(pids[0], limit)

