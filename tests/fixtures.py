"""The fixture layer: real services only.

A pytest plugin, registered once for every test directory (``-p tests.fixtures`` in
pyproject's ``addopts``): the app's tests under ``tests/``, the bench's in ``bench/tests/`` and
the soak's in ``soak/tests/`` reach the same fixtures.

Every fixture here talks to a real process started by ``make up`` (``python -m reconcilers.devstack up``):

- ``stack``          (session) the local stack's settings; fails with a clear message when the
                     control plane is not up (``make test`` brings it up first).
- ``kube``           (session) a ``kubernetes.client.ApiClient`` authenticated as the admin user.
- ``api``            a client made by the app's own door to Kubernetes (``reconcilers._kube.kube``),
                     with ``KUBECONFIG`` pointing at the stack.
- ``namespace``      a fresh namespace per test, deleted afterwards.
- ``metrics_tokens`` tokens of two ServiceAccounts of ``namespace`` (TokenRequest API):
                     ``scraper``, which a ClusterRole allows ``get`` on ``/metrics``, and
                     ``stranger``, which nothing allows anything; the roles deleted afterwards.
- ``redis_client``   the Redis that Celery and the cache use, flushed before the test.
- ``private_redis``  a Redis server of the test's own on a free port, which the test may stop,
                     flush, snapshot and restart from an older snapshot (the shared one is
                     never restarted: other tests use it).
- ``worker_db_url``  a DATABASE_URL pointing at pytest-django's test database, so processes a
                     test starts see the same rows the test does (tests using it need
                     ``transaction=True``, or their rows stay invisible to other processes).
- ``start_process``  a factory for real subprocesses (Celery workers, ``manage.py watch``) with
                     the test's settings; each is stopped at the end of the test and its log is
                     printed when the test fails.
- ``celery_worker``  a factory that starts a real ``celery worker`` process and waits until it
                     consumes.
- ``probe_crds``     (session) the test operator's CRDs (``tests/operatorapp``) installed.
- ``operator``       a factory for the whole operator on one test namespace: a watcher, N
                     worker processes and beat, with fast reaper/lease settings
                     (``FAST_SETTINGS``), as separate real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reconcilers.devstack import config as stack_config  # noqa: E402
from reconcilers.devstack import controlplane  # noqa: E402

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def stack() -> stack_config.StackConfig:
    cfg = stack_config.load()
    if not cfg.kubeconfig.exists() or not controlplane.ready(cfg):
        pytest.fail(
            f"the local control plane is not running (state in {cfg.state_dir}); "
            "run `make up` or use `make test`",
            pytrace=False,
        )
    return cfg


@pytest.fixture(scope="session")
def kube(stack):
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(stack.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def api(stack, monkeypatch):
    from reconcilers._kube import kube as door

    monkeypatch.setenv("KUBECONFIG", str(stack.kubeconfig))
    client = door.new_api_client()
    yield client
    client.close()


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"test": "true"}}})
    yield name
    try:
        core.delete_namespace(name)
    except client.ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def metrics_tokens(kube, namespace) -> Iterator[dict[str, str]]:
    from kubernetes import client

    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    name = f"metrics-reader-{namespace}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]})
    tokens = {}
    for account in ("scraper", "stranger"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        tokens[account] = core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 600}}).status.token
    yield tokens
    for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
        try:
            delete(name)
        except client.ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def redis_client(stack):
    import redis
    from django.conf import settings

    r = redis.Redis.from_url(settings.REDIS_URL)
    r.flushdb()
    yield r
    r.close()


class PrivateRedis:
    """A ``redis-server`` of one test's own, its data in ``directory``: no persistence but the
    snapshots the test takes (``save``) and the one it starts from (``restart``)."""

    def __init__(self, directory: Path):
        from tests.helpers import free_port

        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._popen: subprocess.Popen | None = None
        self._snapshots = 0

    def client(self):
        import redis

        return redis.Redis(port=self.port, socket_timeout=30)

    def start(self) -> None:
        import redis

        log = open(self.directory / "redis.log", "ab")
        self._popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--dbfilename", "dump.rdb", "--daemonize", "no",
             "--save", "", "--appendonly", "no"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                with self.client() as r:
                    if r.ping():
                        return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._popen.poll() is not None:
                    raise AssertionError("the private redis-server did not start:\n"
                                         + (self.directory / "redis.log").read_text())
                time.sleep(0.05)

    def save(self) -> Path:
        """An RDB snapshot of what Redis holds now, kept aside."""
        with self.client() as r:
            r.save()
        self._snapshots += 1
        kept = self.directory / f"snapshot-{self._snapshots}.rdb"
        kept.write_bytes((self.directory / "dump.rdb").read_bytes())
        return kept

    def stop(self, save: bool = False) -> None:
        if self._popen is None or self._popen.poll() is not None:
            return
        import redis

        try:
            with self.client() as r:
                r.execute_command("SHUTDOWN", "SAVE" if save else "NOSAVE")
        except redis.ConnectionError:  # the server hangs up on SHUTDOWN
            pass
        self._popen.wait(30)

    def restart(self, snapshot: Path | None = None) -> None:
        """Stopped and started again: from ``snapshot`` if given, else with every write it
        had (saved on the way down)."""
        self.stop(save=snapshot is None)
        if snapshot is not None:
            (self.directory / "dump.rdb").write_bytes(snapshot.read_bytes())
        self.start()


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(directory)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker_db_url(django_db_setup, django_db_blocker) -> str:
    from django.db import connection

    s = connection.settings_dict
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log_path: Path
    _stopped: bool = field(default=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.name} never logged {text!r}:\n{self.log()[-4000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker and its pool children)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.popen.poll() is None:
            # The main process only: a Celery worker then shuts down warm, finishing its task.
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.popen.wait(10)


@pytest.fixture
def start_process(request, worker_db_url, stack) -> Iterator[Callable[..., Process]]:
    from django.conf import settings

    started: list[Process] = []
    log_dir = ARTIFACTS / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log_path = log_dir / f"{request.node.name[:80]}-{name}-{len(started)}.log"
        log = open(log_path, "wb")
        proc_env = {
            **os.environ,
            "DATABASE_URL": worker_db_url,
            "REDIS_URL": settings.REDIS_URL,
            "KUBECONFIG": str(stack.kubeconfig),
            "DEBUG": "1",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1",
            # Many watchers and workers share this host: endpoints only where a test asks.
            "OPERATOR_WATCHER_HTTP_PORT": "0",
            "OPERATOR_WORKER_HTTP_PORT": "0",
            **(env or {}),
        }
        popen = subprocess.Popen(
            argv, cwd=REPO, env=proc_env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        proc = Process(name, popen, log_path)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for proc in started:
            sys.stderr.write(f"\n--- log of {proc.name} ---\n{proc.log()[-6000:]}\n")


@pytest.fixture
def celery_worker(start_process) -> Callable[..., Process]:
    def start(name: str = "worker", concurrency: int = 1, queues: str | None = None,
              env: dict[str, str] | None = None, pool: str = "prefork",
              args: tuple[str, ...] = ()) -> Process:
        argv = [
            sys.executable, "-m", "celery", "-A", "operator_project", "worker",
            "--loglevel", "INFO", "--pool", pool, "--concurrency", str(concurrency),
            "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h",
            "--without-gossip", "--without-mingle",
        ]
        if queues:
            argv += ["--queues", queues]
        argv += args
        proc = start_process(name, argv, env)
        proc.wait_for_log("ready.", timeout=60)
        return proc

    return start


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


# Seconds, not minutes: lets tests see recovery (lost leases, lost messages) quickly.
FAST_SETTINGS = {
    "RECONCILERS_REAPER_INTERVAL": "1",
    "RECONCILERS_REDISPATCH_AFTER": "3",
    "RECONCILERS_LEASE_SECONDS": "4",
    "RECONCILERS_LEADER_LEASE_SECONDS": "4",
    "RECONCILERS_BACKOFF_BASE": "0.05",
    "RECONCILERS_BACKOFF_MAX": "2",
}


@pytest.fixture(scope="session")
def apply_crd(kube):
    """Server-side apply a CRD manifest (a path) and wait until it is Established: for tests
    outside the app's own (the soak's, the bench's), which import none of its modules."""
    from reconcilers._authoring import crds

    return lambda path: crds.apply_manifest(kube, path)


@pytest.fixture(scope="session")
def probe_crds(kube):
    from reconcilers._authoring import crds

    for path in sorted((REPO / "tests" / "operatorapp" / "crds").glob("*.yaml")):
        crds.apply_manifest(kube, path)
    return ["probes.test.operator.local", "probes.finalizing.operator.local",
            "probes.deadline.operator.local", "probes.configured.operator.local",
            "probes.ratelimited.operator.local", "probes.sharedrate.operator.local",
            "probes.timed.operator.local", "probes.parent.operator.local",
            "probes.statusblind.operator.local"]


@dataclass
class Operator:
    namespace: str
    env: dict
    start_process: Callable[..., Process]
    celery_worker: Callable[..., Process]
    watchers: list = field(default_factory=list)
    workers: list = field(default_factory=list)
    beats: list = field(default_factory=list)

    def start_watcher(self, *reconcilers: str) -> Process:
        proc = self.start_process("watcher", [sys.executable, "manage.py", "watch", *reconcilers],
                                  self.env)
        proc.wait_for_log("leading: starting streams", timeout=60)
        self.watchers.append(proc)
        return proc

    def start_worker(self, concurrency: int = 1, pool: str = "prefork",
                     args: tuple[str, ...] = ()) -> Process:
        proc = self.celery_worker(f"worker{len(self.workers)}", concurrency=concurrency,
                                  env=self.env, pool=pool, args=args)
        self.workers.append(proc)
        return proc

    def start_beat(self, schedule: Path) -> Process:
        proc = self.start_process("beat", [
            sys.executable, "-m", "celery", "-A", "operator_project", "beat",
            "--loglevel", "INFO", "--schedule", str(schedule)], self.env)
        self.beats.append(proc)
        return proc


@pytest.fixture
def operator(namespace, probe_crds, start_process, celery_worker, redis_client, tmp_path):
    """Start with ``operator.start_watcher()``, ``start_worker()``, ``start_beat(...)``."""
    env = {**FAST_SETTINGS, "RECONCILERS_NAMESPACES": namespace,
           "RECONCILERS_LEASE_NAME": f"watcher-{namespace}"}
    op = Operator(namespace, env, start_process, celery_worker)
    op.schedule = tmp_path / "beat-schedule"
    return op
