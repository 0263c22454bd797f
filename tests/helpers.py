"""Small helpers shared by tests: waiting for a condition, reading history, a free port, a
process's HTTP endpoints."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET http://127.0.0.1:<port><path>`` (an error status included)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def https_get(port: int, path: str, token: str | None = None,
              cafile: str | None = None) -> tuple[int, str, dict[str, str]]:
    """Status, body and headers of ``GET https://127.0.0.1:<port><path>``, with ``token`` as
    a bearer token; the server's certificate checked against ``cafile``, else not at all (a
    self-signed pair, as Prometheus scrapes one with ``insecure_skip_verify``)."""
    import ssl

    context = ssl.create_default_context(cafile=cafile)
    if cafile is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def wait_for(check: Callable[[], T], timeout: float = 30, what: str = "condition",
             interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except AssertionError as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f": {last_error}" if last_error else ""))


def at_rest(reconciler: str, namespace: str, name: str, horizon: float = 10) -> bool:
    """The key's runs are over and none is owed: idle or backing off, not dirty, and no run
    due within ``horizon`` seconds. A positive signal for "nothing more happens": what
    follows can only come from a new change, never from work already handed over."""
    from datetime import timedelta

    from django.utils import timezone

    from reconcilers.models import WorkItem
    from reconcilers._base.reconcile import State

    item = WorkItem.objects.filter(reconciler=reconciler, namespace=namespace,
                                   name=name).first()
    return bool(item is not None and item.state in (State.IDLE, State.BACKOFF)
                and not item.dirty and (item.due_at is None or item.due_at
                                        > timezone.now() + timedelta(seconds=horizon)))


def made_together(make: Callable[..., T], threads: int) -> tuple[Callable[..., T], list[int]]:
    """``make`` slowed down so that callers who each make their own all make it at once: every
    call waits (up to 5 s) until ``threads`` calls are inside. Returns it and its call count
    (a list, one entry per call)."""
    made: list[int] = []
    all_inside = threading.Barrier(threads, timeout=5)

    def slow(*args, **kwargs) -> T:
        made.append(1)
        try:
            all_inside.wait()
        except threading.BrokenBarrierError:  # only one made it: the others never came in
            pass
        return make(*args, **kwargs)

    return slow, made


def in_threads(fn: Callable[[], T], threads: int) -> list[T | Exception]:
    """``fn()`` in ``threads`` threads started together; what each returned or raised."""
    out: list[T | Exception] = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    workers = [threading.Thread(target=call) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(10)
    return out


class Relay:
    """A TCP relay to ``target`` on a port of its own, whose connections the test can cut -
    what a load balancer or the server itself does to an idle connection. Bytes pass through
    untouched (TLS ends at the real server)."""

    def __init__(self, target: tuple[str, int]):
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            far = socket.create_connection(self._target)
            with self._lock:
                self._open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        """Close every connection relayed so far, as a server closing idle connections does."""
        with self._lock:
            doomed, self._open = self._open, []
        for s in doomed:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
        self.cut()
