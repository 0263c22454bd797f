"""A small, fast api-server client for the harness itself (loader, observer, checks, metrics).

Not the kubernetes package: the harness must cost as little CPU as possible, since it shares
two cores with whatever it measures, and it must behave identically whichever implementation
runs. Plain urllib3 with keep-alive, the admin token and the stack's CA.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


class Kube:
    def __init__(self, server: str, token: str, ca_file: str, maxsize: int = 16):
        self.server = server.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.pool = urllib3.PoolManager(num_pools=2, maxsize=maxsize, cert_reqs="CERT_REQUIRED",
                                        ca_certs=ca_file, retries=False)

    @classmethod
    def from_config(cls, cfg, maxsize: int = 16) -> "Kube":
        return cls(cfg.apiserver, cfg.token, str(cfg.ca_file), maxsize)

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None,
                content_type: str = "application/json", timeout: float = 30) -> dict:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        resp = self.pool.request(method, self.server + _with_query(path, query or {}),
                                 body=data, headers=headers,
                                 timeout=urllib3.Timeout(connect=5, read=timeout))
        if resp.status >= 300:
            raise ApiError(resp.status, resp.data)
        return json.loads(resp.data) if resp.data else {}

    def get(self, path: str, **query) -> dict:
        return self.request("GET", _with_query(path, query))

    def text(self, path: str) -> str:
        resp = self.pool.request("GET", self.server + path, headers=self.headers,
                                 timeout=urllib3.Timeout(connect=5, read=30))
        if resp.status >= 300:
            raise ApiError(resp.status, resp.data)
        return resp.data.decode()


def _with_query(path: str, query: dict) -> str:
    if not query:
        return path
    from urllib.parse import urlencode

    return f"{path}?{urlencode(query)}"
