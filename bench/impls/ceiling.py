"""The api-server ceiling: plain client-go writes, no operator, at a few concurrency levels.

``apiload ceiling -mode converge`` creates each object and then writes its status (merge patch
with resourceVersion, as the operators do) - what an operator with zero overhead would add,
so its objects/s is the converge scenario's upper bound. ``-mode status`` times only the status
writes on objects that already exist. Client-side rate limiting is off.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .base import Impl
from .controller_runtime import APILOAD, bin_dir, ensure_binaries


def apiload(cfg, command: str, n: int, namespaces: list[str], concurrency: int, value: int,
            prefix: str = "item", mode: str | None = None) -> dict:
    """Run apiload once; returns its JSON result (raises with its output on failure)."""
    argv = [str(bin_dir() / APILOAD), "-n", str(n), "-namespaces", ",".join(namespaces),
            "-prefix", prefix, "-value", str(value), "-concurrency", str(concurrency),
            "-kubeconfig", str(cfg.kubeconfig)]
    if mode:
        argv += ["-mode", mode]
    argv.append(command)  # Go's flag package stops at the first non-flag argument
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"apiload {command} failed ({proc.returncode}): "
                           f"{proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class Ceiling(Impl):
    """Not an operator: the converge scenario runs ``apiload ceiling`` in its place."""

    name: str = "ceiling-c16"
    concurrency: int = 16
    is_ceiling: bool = True

    def prepare(self) -> None:
        ensure_binaries()

    def start(self, trace: Path, sleep_ms: int = 0) -> None:
        pass  # nothing runs between the runs of apiload

    def describe(self) -> dict:
        return {"name": self.name, "tool": "bench/peers/controller-runtime/cmd/apiload",
                "client": "client-go dynamic client, HTTP/2, client-side limiter off",
                "concurrency": self.concurrency}
