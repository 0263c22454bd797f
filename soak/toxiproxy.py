"""A Toxiproxy server of the soak's own, between its operator processes and PostgreSQL, Redis
and the api-server, driven over its HTTP API.

Built from the Go module proxy and cached by version (``reconcilers/devstack/
build-toxiproxy.sh``). Each proxy listens on a free loopback port; the soak's operator gets
``DATABASE_URL``, ``REDIS_URL`` and a kubeconfig naming those ports. The api-server's serving
certificate covers 127.0.0.1 whatever the port, so TLS verification holds through the proxy.
A fault is a toxic added for a window and removed after it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from reconcilers.devstack.config import HERE as DEVSTACK

# What each toxic does to a connection while it is in place (Toxiproxy's own vocabulary).
TOXICS = {
    "latency": ("latency", {"latency": 700, "jitter": 300}),
    "black hole": ("timeout", {"timeout": 0}),  # nothing passes, nothing is closed
    "reset": ("reset_peer", {"timeout": 0}),  # every connection reset (RST) as data arrives
    "data limit": ("limit_data", {"bytes": 2000}),  # cut after a few kB
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary() -> Path:
    out = subprocess.run(["bash", str(DEVSTACK / "build-toxiproxy.sh")], check=True,
                         stdout=subprocess.PIPE, text=True, timeout=1800)
    return Path(out.stdout.strip().splitlines()[-1])


class Toxiproxy:
    def __init__(self, log: Path):
        self.port = free_port()
        self.popen = subprocess.Popen(
            [str(binary()), "-host", "127.0.0.1", "-port", str(self.port)],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.listen: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/version")
                return
            except OSError:
                if time.monotonic() > deadline or self.popen.poll() is not None:
                    raise RuntimeError(f"toxiproxy did not start (log: {log})")
                time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict | None = None) -> object:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            data = resp.read()
        return json.loads(data) if data.strip() else None

    def proxy(self, name: str, upstream_port: int) -> int:
        """A proxy to ``127.0.0.1:upstream_port``; returns the port it listens on."""
        port = free_port()
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{port}",
                                        "upstream": f"127.0.0.1:{upstream_port}",
                                        "enabled": True})
        self.listen[name] = port
        return port

    def add(self, proxy: str, fault: str) -> None:
        """The fault on both directions of every connection through ``proxy``."""
        kind, attributes = TOXICS[fault]
        for stream in ("upstream", "downstream"):
            self._call("POST", f"/proxies/{proxy}/toxics", {
                "name": f"{kind}-{stream}", "type": kind, "stream": stream, "toxicity": 1.0,
                "attributes": attributes})

    def enable(self, proxy: str, enabled: bool) -> None:
        """A disabled proxy closes its connections and refuses new ones."""
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def clear(self, proxy: str) -> None:
        for toxic in self._call("GET", f"/proxies/{proxy}/toxics") or []:
            try:
                self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
