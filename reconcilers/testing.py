"""Test your reconcilers: one reconcile in your test's own process, or the whole operator.

    from reconcilers.testing import reconcile_once

    def test_a_foo_gets_its_deployment(my_namespace):
        kubectl_apply(foo)                       # however your test makes the object
        run = reconcile_once("foos.samplecontroller.k8s.io", my_namespace, "example-foo")
        assert run.outcome == "success"
        assert [(w.method, w.kind) for w in run.writes][:1] == [("POST", "deployments")]

It runs exactly what a worker runs for that key - the object read, finalizer handling, your
``reconcile`` / ``finalize``, the status written from a typed resource, the decision on what
follows - against the api-server ``KUBECONFIG`` names (or the ``api`` you pass), without the
ledger, Celery or the watcher. Nothing is recorded in history. A reconcile that raises is not
re-raised: its outcome and exception are in the ``Run``, as a worker would record them.

``FakeCluster`` is an api-server in memory for unit tests, seeded with objects and run by
the same code: ``reconcile_once(MyReconciler, "default", "example", cluster=cluster)`` reads
and writes nothing else - no api-server, Redis or PostgreSQL - and takes milliseconds::

    cluster = FakeCluster.from_yaml(FOO_YAML)
    run = reconcile_once("foos.samplecontroller.k8s.io", "default", "example-foo",
                         cluster=cluster)
    assert cluster.get("apps/v1", "Deployment", "example-foo")["spec"]["replicas"] == 1

What it models, and the ``NotModelled`` error it raises for the rest: docs/writing/testing.md.

``run_operator(namespace)`` runs your project's watcher and a worker around a block, for tests
that go through the whole pipeline. As a pytest plugin the module also gives the fixtures
``kube_api`` and ``k8s_namespace``, and the option ``--local-stack``: before Django reads your
settings it brings up this package's local stack (PostgreSQL, Redis, etcd, kube-apiserver and
kube-controller-manager on 127.0.0.1, built and cached on first use; ``reconcilers.devstack``)
and points ``KUBECONFIG``, ``DATABASE_URL`` and ``REDIS_URL`` at it. Without it the fixtures
use the cluster ``KUBECONFIG`` names. For the option, load the plugin from the command line or
``addopts`` (``-p reconcilers.testing --local-stack``): a conftest.py is read after Django.

The module imports nothing of Django at import time, so pytest can load it that early.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from typing import TYPE_CHECKING

import yaml

from reconcilers._kube import kube
from reconcilers._kube.fake import FakeApiServer, NotModelled
from reconcilers._base.reconcile import Key

if TYPE_CHECKING:
    from reconcilers._authoring.reconciler import Reconciler

__all__ = ["FakeCluster", "NotModelled", "OperatorProcesses", "Run", "Write", "api_get",
           "api_request", "apply_crd", "reconcile_once", "replay_inputs", "run_operator"]


@dataclass(frozen=True)
class Write:
    """One write the run made to the api-server."""

    method: str  # POST, PATCH, PUT, DELETE
    path: str  # the API path, e.g. /apis/apps/v1/namespaces/ns/deployments/web
    body: Any

    @property
    def kind(self) -> str:
        """The resource's plural, with ``/status`` for a status write: ``deployments``,
        ``foos/status``."""
        parts = self.path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]  # after the group and version
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        return f"{rest[0]}/status" if rest[2:3] == ["status"] else rest[0]


@dataclass(frozen=True)
class Run:
    """How one reconcile ended, and what it did."""

    outcome: str  # success, requeue, requeue_after, error, permanent, gone, skipped
    delay: float | None  # seconds until the key would run again; None: not by itself
    error: BaseException | None
    writes: list[Write] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    obj: dict | None = None  # the object as the run left it

    @property
    def ok(self) -> bool:
        return self.outcome in ("success", "requeue_after")


def api_request(api, method: str, path: str, body: Any = None, **options: Any) -> Any:
    """One call to the api-server as the operator makes it (the ``kube_api`` fixture's client):
    the parsed JSON answer; a non-2xx answer raises, with its status and reason."""
    return kube.request(api, method, path, body, **options)


def api_get(api, path: str) -> dict | None:
    """GET ``path``; ``None`` when the object does not exist."""
    return kube.get_or_none(api, path)


def apply_crd(api, path: Path) -> str:
    """Server-side apply one CRD manifest file and wait until the api-server serves it."""
    from reconcilers._authoring import crds

    return crds.apply_manifest(api, path)


def reconcile_once(reconciler: str | type[Reconciler], namespace: str, name: str, *,
                   api: kube.ApiClient | None = None, cluster: FakeCluster | None = None,
                   attempts: int = 0) -> Run:
    """Reconcile ``namespace/name`` once with ``reconciler`` (its name or class, registered).

    ``cluster``: a ``FakeCluster`` to run against instead of an api-server. ``attempts``:
    failures before this run, as the ledger would count them (the backoff of an error's retry
    grows with it)."""
    if cluster is not None and api is not None:
        raise TypeError("reconcile_once takes an api or a cluster, not both")
    api = cluster if cluster is not None else api
    from reconcilers._base.conf import settings
    from reconcilers._authoring.registry import registry as default_registry
    from reconcilers._run.call import attempt

    name_of = reconciler if isinstance(reconciler, str) else reconciler.name()
    cls = default_registry.get_class(name_of)
    key = Key(name_of, namespace if cls.primary().namespaced else "", name)
    done = attempt(key, cls, default_registry, attempts=attempts,
                   backoff=settings().backoff(cls.backoff_base, cls.backoff_max), api=api)
    return Run(outcome=done.decision.outcome, delay=done.decision.delay, error=done.error,
               writes=[Write(*w) for w in (done.ctx.writes if done.ctx else [])],
               events=list(done.seen.events), obj=done.seen.final or done.seen.obj)


def replay_inputs(inputs: dict) -> Run:
    """Run the current code on a recorded run's inputs (what ``manage.py replay --as-test``
    keeps in a regression test): reads answered from them, writes captured - nothing reaches
    the api-server."""
    from reconcilers._run.replay import replay_inputs as run_on

    done = run_on(inputs)
    return Run(outcome=done.outcome, delay=None,
               error=RuntimeError(done.error) if done.error else None,
               writes=[Write(w["method"], w["path"], w["body"]) for w in done.writes],
               obj=done.obj)


class FakeCluster(FakeApiServer):
    """An api-server in memory, seeded with objects, for unit tests (controller-runtime's fake
    client, at the HTTP level): pass it as ``reconcile_once(..., cluster=)`` - or as the
    ``api`` of any call - and the reconciler, ``ctx`` and the runner send it the requests they
    would send the api-server, answered by its rules (docs/writing/testing.md says which). A
    request it does not model raises ``NotModelled``, naming what is missing.

    ``objects``: dicts to create, in order (their status kept, an owner reference without a
    uid given the uid of the seeded owner it names). ``crds``: CustomResourceDefinitions
    (dicts) it serves; by default those of every registered reconciler's resource."""

    def __init__(self, objects: list[dict] | tuple = (), *, crds: list[dict] | None = None):
        super().__init__(_registered_crds() if crds is None else crds)
        for obj in objects:
            self.create(obj)

    @classmethod
    def from_yaml(cls, *documents: str | Path, crds: list[dict] | None = None) -> FakeCluster:
        """Seeded from YAML: each argument a file's path or YAML text, of one or more
        documents."""
        objects = []
        for doc in documents:
            text = doc.read_text() if isinstance(doc, Path) else doc
            objects += [o for o in yaml.safe_load_all(text) if o]
        return cls(objects, crds=crds)

    def create(self, obj: dict, namespace: str = "default") -> dict:
        """Create ``obj`` (in its namespace, or ``namespace``; the namespace made when
        missing) as a test's setup would, status and deletion included: what the cluster now
        holds."""
        obj = {**obj, "metadata": dict(obj.get("metadata") or {})}
        meta = obj["metadata"]
        gvr = self.kind_for(obj["apiVersion"], obj["kind"])
        ns = (meta.get("namespace") or namespace) if gvr.namespaced else None
        if ns and self.get("v1", "Namespace", ns) is None:
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        meta["ownerReferences"] = [self._resolved(ref, ns)
                                   for ref in meta.get("ownerReferences") or []] or None
        meta = {k: v for k, v in meta.items() if v is not None}
        made = self.request("POST", gvr.path(ns), {**obj, "metadata": meta})
        if obj.get("status") and made.get("status") != obj["status"]:
            made = self.request("PATCH", gvr.path(ns, meta["name"]) + "/status",
                                {"status": obj["status"]}, content_type=kube.MERGE_PATCH)
        if meta.get("deletionTimestamp"):
            self.request("PATCH", gvr.path(ns, meta["name"]),
                         {"metadata": {"finalizers": meta.get("finalizers") or ["test"]}},
                         content_type=kube.MERGE_PATCH)
            made = self.request("DELETE", gvr.path(ns, meta["name"])) \
                if meta.get("finalizers") else made
        return made

    def _resolved(self, ref: dict, namespace: str | None) -> dict:
        if ref.get("uid"):
            return ref
        owner = self.get(ref["apiVersion"], ref["kind"], ref["name"], namespace or "")
        if owner is None:
            raise LookupError(f"seeded owner reference to {ref['kind']} {ref['name']}: "
                              "create the owner first, or give the reference its uid")
        return {**ref, "uid": owner["metadata"]["uid"]}

    def get(self, api_version: str, kind: str, name: str,
            namespace: str = "default") -> dict | None:
        """The object as the cluster holds it now; None when there is none."""
        gvr = self.kind_for(api_version, kind)
        return self.object(gvr, namespace if gvr.namespaced else None, name)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict]:
        """Every object of a kind (in ``namespace``; all by default)."""
        return self.objects(self.kind_for(api_version, kind), namespace)

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> None:
        """Delete as ``kubectl delete`` does: with finalizers, only marked as being deleted;
        without, gone, and its dependents collected."""
        gvr = self.kind_for(api_version, kind)
        self.request("DELETE", gvr.path(namespace if gvr.namespaced else None, name))

    def events(self, namespace: str | None = None) -> list[dict]:
        """The Events written, through either API, as ``{"type", "reason", "message",
        "object": "Kind/name", "count"}``."""
        found = []
        for api_version, regarding, note in (("events.k8s.io/v1", "regarding", "note"),
                                             ("v1", "involvedObject", "message")):
            for e in self.list(api_version, "Event", namespace):
                about = e.get(regarding) or {}
                found.append({"type": e.get("type"), "reason": e.get("reason"),
                              "message": e.get(note), "object": f"{about.get('kind')}/"
                              f"{about.get('name')}",
                              "count": (e.get("series") or {}).get("count") or e.get("count")
                              or 1})
        return found


@functools.lru_cache(maxsize=None)
def _manifest(path: str, mtime: float) -> dict:
    """A CRD manifest, parsed once per version of the file (each test's cluster needs it; the
    cluster copies what it is given)."""
    return yaml.safe_load(Path(path).read_text())


def _registered_crds() -> list[dict]:
    """The CRD of every registered reconciler's primary resource: from its typed resource, or
    the manifest its app ships."""
    from reconcilers._authoring.crds import manifest_for
    from reconcilers._authoring.registry import autodiscover, registry
    from reconcilers.resources.crd import crd

    autodiscover()
    found: dict[str, dict] = {}
    for name in registry.names():
        cls = registry.get_class(name)
        path = manifest_for(cls)
        if path is not None:
            found[name] = _manifest(str(path), path.stat().st_mtime)
        elif cls.resource is not None:
            found[name] = crd(cls.resource)
    return list(found.values())


# --- running the whole operator inside a test ----------------------------------------------


class OperatorProcesses:
    """A watcher and a worker of your project, started from its ``manage.py`` and Celery app
    for one test (like kopf's ``KopfRunner``); ``run_operator`` makes one."""

    def __init__(self, procs: list, logs: dict[str, Path]) -> None:
        self._procs, self.logs = procs, logs

    def log(self, role: str) -> str:
        """What the watcher or the worker printed so far."""
        return self.logs[role].read_text(errors="replace")

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def run_operator(namespace: str, *, celery_app: str | None = None, project: Path | None = None,
                 env: dict[str, str] | None = None, migrate: bool = True,
                 timeout: float = 90) -> Iterator[OperatorProcesses]:
    """Run the watcher (for ``namespace`` only) and one prefork worker of the project in
    ``project`` (default: the current directory) until the block ends. Ready when both answer
    ``/readyz`` (each on a free port): the watcher leads with synced caches, the worker
    consumes. ``celery_app``: what ``celery -A`` takes (default: the settings module's
    package, as ``django-admin startproject`` lays it out). ``migrate``: bring the database
    the processes use up to date first (a no-op when it is; a fresh ``--local-stack`` database
    needs it)."""
    project = Path(project or os.getcwd())
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
    celery_app = celery_app or settings_module.rpartition(".")[0] or settings_module
    ports = {"watcher": _free_port(), "worker": _free_port()}
    run_env = {**os.environ, "RECONCILERS_NAMESPACES": namespace,
               "RECONCILERS_LEASE_NAME": f"test-{namespace}"[:63],
               "OPERATOR_WATCHER_HTTP_PORT": str(ports["watcher"]),
               "OPERATOR_WORKER_HTTP_PORT": str(ports["worker"]), **(env or {})}
    commands = {"watcher": [sys.executable, "manage.py", "watch"],
                "worker": [sys.executable, "-m", "celery", "-A", celery_app, "worker",
                           "--pool", "prefork", "--concurrency", "2", "--without-gossip",
                           "--without-mingle", "--loglevel", "INFO"]}
    if migrate:
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                              cwd=project, env=run_env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py migrate failed:\n{done.stdout}{done.stderr}")
    logs, procs = {}, []
    scratch = Path(tempfile.mkdtemp(prefix="operator-test-"))
    try:
        for role, argv in commands.items():
            logs[role] = scratch / f"{role}.log"
            with open(logs[role], "wb") as out:
                procs.append(subprocess.Popen(argv, cwd=project, env=run_env, stdout=out,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
        running = OperatorProcesses(procs, logs)
        deadline = time.monotonic() + timeout
        for role, port in ports.items():
            while not _ready(port):
                exited = [r for r, p in zip(commands, procs) if p.poll() is not None]
                if exited or time.monotonic() > deadline:
                    why = f"exited: {', '.join(exited)}" if exited else f"{timeout:g}s passed"
                    raise RuntimeError(f"the {role} did not become ready ({why}):\n"
                                       f"{running.log(role)[-3000:]}")
                time.sleep(0.3)
        yield running
    finally:
        OperatorProcesses(procs, logs).stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


# --- pytest fixtures: ``pytest_plugins = ["reconcilers.testing"]`` in your conftest.py --------

try:
    import pytest
except ImportError:  # the helpers above work without pytest
    pytest = None

STACK_VARIABLES = ("KUBECONFIG", "DATABASE_URL", "REDIS_URL")

if pytest is not None:

    def pytest_addoption(parser) -> None:
        parser.getgroup("reconcilers").addoption(
            "--local-stack", action="store_true",
            help="bring up the local stack (reconcilers.devstack) and point KUBECONFIG, "
                 "DATABASE_URL and REDIS_URL at it before Django loads")

    @pytest.hookimpl(wrapper=True)
    def pytest_load_initial_conftests(early_config, parser, args):
        # A wrapper runs before pytest-django's own hook, which loads the settings.
        if getattr(early_config.known_args_namespace, "local_stack", False):
            from .devstack import config, stack

            env = stack.up(config.load())
            os.environ.update({k: env[k] for k in STACK_VARIABLES})
        return (yield)

    @pytest.fixture(scope="session")
    def kube_api() -> kube.ApiClient:
        """A client for the cluster ``KUBECONFIG`` names (in-cluster credentials without)."""
        try:
            api = kube.api_client()
            kube.version(api)
        except Exception as exc:  # fail here, clearly, when there is no cluster to talk to
            pytest.fail(f"no Kubernetes cluster to test against ({exc}); set KUBECONFIG, or "
                        "run pytest with `-p reconcilers.testing --local-stack`", pytrace=False)
        return api

    @pytest.fixture(scope="session")
    def k8s_crds(kube_api) -> list[str]:
        """The CRDs of every registered reconciler that ships one (``<app>/crds/``, what
        ``manage.py makecrds`` writes), applied once per session and Established."""
        from reconcilers._authoring.crds import apply_manifest, manifest_for
        from reconcilers._authoring.registry import autodiscover, registry

        autodiscover()
        applied = []
        for name in registry.names():
            path = manifest_for(registry.get_class(name))
            if path is not None:
                apply_manifest(kube_api, path)
                applied.append(path.stem)
        return applied

    @pytest.fixture
    def k8s_namespace(kube_api) -> Iterator[str]:
        """A namespace of its own for one test, deleted afterwards."""
        name = f"test-{uuid.uuid4().hex[:10]}"
        kube.request(kube_api, "POST", "/api/v1/namespaces",
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        yield name
        try:
            kube.request(kube_api, "DELETE", f"/api/v1/namespaces/{name}")
        except kube.ApiError as exc:
            if not exc.gone:
                raise
