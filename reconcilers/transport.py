"""HTTP/1.1 to the api-server for calls answered with one body: kept-alive TLS connections per
client, the official client's TLS settings and credentials, a parser of only what an answer
needs.

Why not the official client's own path (``ApiClient.call_api`` -> urllib3 -> ``http.client``):
on this project's hot path - a run's status write - it cost ~0.55-0.65 ms of CPU per request,
most of it in generic layers (a URL parse and pool lookup per call, retry bookkeeping,
``http.client``'s email-based header parser); this costs ~0.15 ms (docs/benchmarks.md, change
20). Watches (streams) and clients configured with a proxy keep the official path.

What it does and does not do: one request per connection at a time, bodies by Content-Length
or chunked (or until close), 1xx answers skipped, ``Connection: close`` honoured. An idle
connection the server closed is noticed before reuse; one closed in the instant between (the
request could not be sent, or the server answered nothing on a reused connection) is retried
once on a new one - for any method when nothing was sent, for idempotent ones otherwise.
Everything else that fails is a ``ConnectionFailed``.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
from collections import deque
from typing import Any, Callable, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

MAX_LINE = 65536  # as http.client: a longer status or header line is not HTTP
MAX_HEADERS = 100
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})  # no Content-Length unless a body
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"  # what a request target may carry as is (RFC 3986)


class ConnectionFailed(OSError):
    """The api-server could not be reached, or the exchange broke off (no HTTP answer)."""


class Response(NamedTuple):
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes


class _Stale(Exception):
    """A reused connection turned out closed: ``sent`` says whether the request went out."""

    def __init__(self, sent: bool):
        self.sent = sent


class _Connection:
    __slots__ = ("sock", "rfile")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.rfile = sock.makefile("rb")

    def dropped(self) -> bool:
        """Readable while idle: the server closed it (or sent what nobody asked for)."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        for closing in (self.rfile.close, self.sock.close):
            try:
                closing()
            except OSError:
                pass


class Transport:
    """Requests to one api-server, as one client's configuration describes it."""

    def __init__(self, host: str, *, ssl_context: ssl.SSLContext | None,
                 server_hostname: str | None, headers: dict[str, str],
                 credentials: Callable[[], dict[str, str]], maxsize: int):
        url = urlsplit(host)
        self._address = (url.hostname or "localhost",
                         url.port or (443 if url.scheme == "https" else 80))
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc.rpartition("@")[2]
        self._ssl = ssl_context
        self._server_hostname = server_hostname or self._address[0]
        self._static = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._credentials = credentials
        self._maxsize = max(1, maxsize)
        self._idle: deque[_Connection] = deque()
        self._pid = os.getpid()
        self.opened = 0  # connections made so far (each a TCP and TLS handshake)

    @classmethod
    def of(cls, configuration: Any, default_headers: dict[str, str],
           credentials: Callable[[], dict[str, str]]) -> "Transport | None":
        """The transport for an official client ``Configuration``; ``None`` where only the
        official path will do (a proxy in the way)."""
        if configuration.proxy:
            return None
        context = None
        if configuration.host.startswith("https:"):
            if configuration.verify_ssl:
                cafile = configuration.ssl_ca_cert
                if not cafile:
                    import certifi  # the official client's default trust store, as it does

                    cafile = certifi.where()
                context = ssl.create_default_context(cafile=cafile)
                if configuration.assert_hostname is False:
                    context.check_hostname = False
            else:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
        return cls(configuration.host, ssl_context=context,
                   server_hostname=configuration.tls_server_name or None,
                   headers=dict(default_headers), credentials=credentials,
                   maxsize=configuration.connection_pool_maxsize or 4)

    def request(self, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
                headers: dict[str, str], body: bytes | None = None,
                timeout: float | tuple[float, float] | None = None) -> Response:
        """One exchange; any HTTP status is a ``Response``, no answer a ``ConnectionFailed``."""
        connect_timeout, read_timeout = timeout if isinstance(timeout, tuple) else (timeout,) * 2
        target = self._prefix + quote(path, safe=_PATH_SAFE)
        if query:
            target += "?" + urlencode(query)
        head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, **self._credentials()}.items())
        if body is not None or method not in BODILESS:
            head += f"Content-Length: {len(body or b'')}\r\n"
        payload = (f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n{self._static}"
                   f"{head}\r\n").encode("latin-1")
        if body:
            payload += body
        for attempt in (1, 2):
            conn, reused = self._checkout(connect_timeout)
            try:
                response, keep = self._exchange(conn, reused, method, payload, read_timeout)
            except _Stale as stale:
                conn.close()
                if attempt == 1 and (not stale.sent or method in IDEMPOTENT):
                    continue
                raise ConnectionFailed(f"{method} {path}: the api-server closed the connection "
                                       "without answering") from None
            except BaseException as exc:
                conn.close()
                if isinstance(exc, (OSError, ValueError)):
                    raise ConnectionFailed(f"{method} {path}: {type(exc).__name__}: {exc}") \
                        from exc
                raise
            if keep:
                self._checkin(conn)
            else:
                conn.close()
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the idle connections (one in use closes when its exchange ends)."""
        while self._idle:
            self._idle.pop().close()

    def _checkout(self, connect_timeout: float | None) -> tuple[_Connection, bool]:
        if self._pid != os.getpid():  # a forked child: those sockets are its parent's
            self._idle, self._pid = deque(), os.getpid()
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return self._connect(connect_timeout), False
            if not conn.dropped():
                return conn, True
            conn.close()

    def _checkin(self, conn: _Connection) -> None:
        if len(self._idle) < self._maxsize and self._pid == os.getpid():
            self._idle.append(conn)
        else:
            conn.close()

    def _connect(self, timeout: float | None) -> _Connection:
        self.opened += 1
        try:
            sock = socket.create_connection(self._address, timeout=timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {self._host_header}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConnectionFailed(f"TLS with {self._host_header}: {exc}") from exc
        return _Connection(sock)

    @staticmethod
    def _exchange(conn: _Connection, reused: bool, method: str, payload: bytes,
                  timeout: float | None) -> tuple[Response, bool]:
        conn.sock.settimeout(timeout)
        try:
            conn.sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            if reused:
                raise _Stale(sent=False) from None
            raise
        rfile = conn.rfile
        while True:
            try:
                line = rfile.readline(MAX_LINE + 1)
            except ConnectionResetError:
                line = b""
            if not line:
                if reused:
                    raise _Stale(sent=True)
                raise ConnectionFailed("the api-server closed the connection without answering")
            version, status, reason = _status_line(line)
            headers = _headers(rfile)
            if not 100 <= status < 200:
                break  # 1xx (100 Continue, 103 Early Hints): the answer is still to come
        keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = _chunked(rfile)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            body = rfile.read(length)
            if len(body) != length:
                raise ConnectionFailed(f"the answer ended after {len(body)} of {length} bytes")
        else:
            body, keep = rfile.read(), False  # delimited by the connection's close
        return Response(status, reason, headers, body), keep


def _status_line(line: bytes) -> tuple[str, int, str]:
    if len(line) > MAX_LINE:
        raise ValueError("status line too long")
    version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP status line: {line[:80]!r}")
    return version, int(code), reason.strip()


def _headers(rfile) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = rfile.readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n", b""):
            return headers
        if len(line) > MAX_LINE:
            raise ValueError("header line too long")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ValueError(f"not a header line: {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    raise ValueError(f"more than {MAX_HEADERS} headers")


def _chunked(rfile) -> bytes:
    parts = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if not line:
            raise ConnectionFailed("the answer ended inside a chunk header")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            break
        data = rfile.read(size)
        if len(data) != size or rfile.read(2) != b"\r\n":
            raise ConnectionFailed("the answer ended inside a chunk")
        parts.append(data)
    _headers(rfile)  # trailers, if any: nothing here reads them
    return b"".join(parts)
