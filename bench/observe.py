"""The observer: a separate watch process that timestamps when each object converges.

``python -m bench.observe --out FILE`` lists BenchItems (all namespaces), prints ``READY`` once
its watch is open, then appends one JSON line ``{"t": unix, "o": "ns/name", "g": generation}``
each time an object becomes converged at a generation (status.observedGeneration ==
metadata.generation and status.value == spec.value). It is its own process so its parsing never
competes for the harness's GIL, and it judges every implementation by the same events.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import urllib3

from . import config
from .kube import Kube, _with_query
from .workload import converged, path


def observe(kube: Kube, out, stop: threading.Event) -> None:
    body = kube.get(path(), limit="5000")
    rv = body["metadata"]["resourceVersion"]
    done: dict[str, int] = {}
    for obj in body.get("items", []):
        if converged(obj):
            meta = obj["metadata"]
            done[f"{meta['namespace']}/{meta['name']}"] = meta["generation"]
    ready = False
    while not stop.is_set():
        query = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": "1800"}
        resp = kube.pool.request("GET", kube.server + _with_query(path(), query),
                                 headers=kube.headers, preload_content=False,
                                 timeout=urllib3.Timeout(connect=5, read=1900))
        if resp.status >= 300:
            raise SystemExit(f"observer watch failed: HTTP {resp.status} {resp.read()[:300]!r}")
        if not ready:
            print("READY", flush=True)
            ready = True
        buf = b""
        for chunk in resp.stream(65536, decode_content=True):
            now = time.time()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion") or rv
                if event.get("type") in ("ADDED", "MODIFIED") and converged(obj):
                    key = f"{meta['namespace']}/{meta['name']}"
                    if done.get(key) != meta["generation"]:
                        done[key] = meta["generation"]
                        out.write(json.dumps({"t": round(now, 6), "o": key,
                                              "g": meta["generation"]}) + "\n")
                elif event.get("type") == "ERROR":
                    raise SystemExit(f"observer watch error: {obj}")
            out.flush()
            if stop.is_set():
                break
        resp.release_conn()


@dataclass
class Observer:
    """The harness's handle on an observer process: start it, read what it saw, stop it."""

    out: Path
    popen: subprocess.Popen | None = None
    _offset: int = 0
    _partial: str = ""
    seen: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # obj -> [(g, t)]

    def start(self, timeout: float = 30) -> "Observer":
        self.out.write_text("")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.observe", "--out", str(self.out)],
            cwd=config.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        seen = []
        for line in self.popen.stdout:  # blocks until READY (or the process dies)
            if line.strip() == "READY":
                return self
            seen.append(line)
        self.popen.wait(5)
        raise RuntimeError(f"observer did not start ({self.popen.returncode}): {''.join(seen)[-2000:]}")

    def poll(self) -> int:
        """Read new lines; returns how many objects have ever converged."""
        if not self.out.exists():  # never started
            return 0
        with open(self.out) as f:
            f.seek(self._offset)
            data = f.read()
            self._offset = f.tell()
        data = self._partial + data
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line:
                rec = json.loads(line)
                self.seen.setdefault(rec["o"], []).append((rec["g"], rec["t"]))
        return len(self.seen)

    def converged_at(self, obj: str, generation: int) -> float | None:
        """When ``obj`` was first seen converged at ``generation`` or later."""
        for g, t in self.seen.get(obj, ()):
            if g >= generation:
                return t
        return None

    def wait(self, done, timeout: float, interval: float = 0.05) -> bool:
        """Poll until ``done(self)`` is true; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if done(self):
                return True
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"observer exited with {self.popen.returncode}")
            time.sleep(interval)
        self.poll()
        return done(self)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self.poll()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()

    def terminate(*_):
        stop.set()
        raise SystemExit(0)  # interrupts a blocked read; ``finally`` below flushes the file

    signal.signal(signal.SIGTERM, terminate)
    kube = Kube.from_config(config.load(), maxsize=2)
    with open(args.out, "a", buffering=1 << 16) as out:
        try:
            observe(kube, out, stop)
        except KeyboardInterrupt:
            pass
        finally:
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
