"""The framework app as a Django team installs it: a wheel, a fresh virtualenv, a project of
their own (``django-admin startproject``) with a custom user model and their own admin site."""

from __future__ import annotations

import ast
import email
import os
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import REPO

pytestmark = pytest.mark.e2e


def _run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, REPO], REPO)
    (path,) = out.glob("django_crd_operator-*.whl")
    return path


def test_the_wheel_holds_the_app_and_nothing_of_the_project(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"reconcilers"}
    for needed in ("reconcilers/migrations/0001_initial.py", "reconcilers/py.typed",
                   "reconcilers/devstack/build-control-plane.sh",
                   "reconcilers/devstack/versions.env",
                   "reconcilers/templates/reconcilers/admin/dashboard.html",
                   "reconcilers/contrib/samplecontroller/crds/foos.samplecontroller.k8s.io.yaml"):
        assert needed in names
    assert not [n for n in names if "tests/" in n or "conftest" in n or "operator_project" in n]


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(name))


def _requires(metadata: email.message.Message) -> list[Requirement]:
    return [Requirement(r) for r in metadata.get_all("Requires-Dist")]


def test_the_wheel_names_its_license_and_carries_the_text(wheel):
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in metadata.get_all("License-File")
    with zipfile.ZipFile(wheel) as z:
        (text,) = [z.read(n).decode() for n in z.namelist()
                   if n.endswith(".dist-info/licenses/LICENSE")]
    assert text == (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for field in ("Summary", "Author", "Keywords", "Description-Content-Type"):
        assert metadata[field], field


def _imports(wheel: Path) -> dict[str, bool]:
    """Top-level module -> whether the wheel's code needs it to load (False: imported only
    inside functions or under ``try: ... except ImportError``, an optional dependency's
    patterns)."""
    found: dict[str, bool] = {}

    def optional(node: ast.AST) -> bool:
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
            isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError",
                                                                "ModuleNotFoundError")
                for h in node.handlers))

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                found[top] = found.get(top, False) or eager
            visit(child, eager and not optional(child))

    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".py"):
                visit(ast.parse(z.read(name), name), True)
    return {m: eager for m, eager in found.items()
            if m not in sys.stdlib_module_names and m != "reconcilers"}


def test_every_module_the_code_imports_is_a_declared_dependency(wheel):
    """What the code needs to load comes from an unconditional Requires-Dist; an optional
    import (pytest in reconcilers.testing) may come from an extra. The module ->
    distribution map is the one of this venv, where every dependency is installed."""
    requires = _requires(_metadata(wheel))
    declared = {canonicalize_name(r.name) for r in requires}
    always = {canonicalize_name(r.name) for r in requires if r.marker is None}
    provides = packages_distributions()
    imports = _imports(wheel)
    assert {"redis", "urllib3", "kubernetes", "django", "celery"} <= imports.keys()
    for module, eager in sorted(imports.items()):
        assert module in provides, f"{module}: imported, but no installed distribution has it"
        dists = {canonicalize_name(d) for d in provides[module]}
        assert dists & (always if eager else declared), \
            f"{module} (from {sorted(dists)}) is imported but not declared in pyproject.toml"


def test_psycopg_is_a_plain_dependency_with_the_binary_build_an_extra(wheel):
    requires = _requires(_metadata(wheel))
    (psycopg,) = [r for r in requires if r.name == "psycopg" and r.marker is None]
    assert not psycopg.extras
    (binary,) = [r for r in requires
                 if r.marker is not None and r.marker.evaluate({"extra": "binary"})
                 and not r.marker.evaluate({"extra": ""})]
    assert binary.name == "psycopg" and binary.extras == {"binary"}
    assert "binary" in _metadata(wheel).get_all("Provides-Extra")
    # This repository's own installs keep the prebuilt build (no libpq needed in the image).
    assert "psycopg[binary]==" in (REPO / "requirements.in").read_text()


def test_requires_python_is_what_ci_runs(wheel):
    """CI runs Python 3.11 (the image's python:3.11-slim); nothing older is claimed."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(_metadata(wheel)["Requires-Python"])
    assert "3.11.2" in spec and "3.11.7" in spec  # bookworm's and this venv's
    assert "3.10.14" not in spec
    classifiers = _metadata(wheel).get_all("Classifier")
    assert [c for c in classifiers if c.startswith("Programming Language :: Python :: 3.")] == [
        "Programming Language :: Python :: 3.11"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == str(spec)


def test_a_project_of_ones_own_installs_and_runs_the_operator(wheel, tmp_path, stack, kube,
                                                                namespace):
    """Install, migrate, check - then the watcher and a worker from that project's own
    ``manage.py`` and Celery app converge an object of the sample operator it enabled."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          f"{wheel}[binary,test]"], tmp_path, timeout=900)
    _run([venv / "bin" / "django-admin", "startproject", "mysite", "."], tmp_path)
    accounts = tmp_path / "accounts"
    accounts.mkdir()
    (accounts / "__init__.py").write_text("")
    (accounts / "models.py").write_text(textwrap.dedent("""
        from django.contrib.auth.models import AbstractUser
        from django.db import models


        class Person(AbstractUser):
            team = models.CharField(max_length=50, blank=True)
    """))
    database = f"package_{os.getpid()}"
    _admin_sql(stack, f"CREATE DATABASE {database}")
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + textwrap.dedent("""
        import os
        from urllib.parse import urlsplit

        INSTALLED_APPS += ["accounts", "reconcilers", "reconcilers.contrib.samplecontroller"]
        AUTH_USER_MODEL = "accounts.Person"
        _db = urlsplit(os.environ["DATABASE_URL"])
        DATABASES = {"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": _db.path.lstrip("/"),
            "HOST": _db.hostname, "PORT": _db.port, "USER": _db.username,
            "PASSWORD": _db.password}}
        REDIS_URL = os.environ["REDIS_URL"]
        CELERY_BROKER_URL = REDIS_URL
    """))
    # The project's own Celery app, as Celery's Django guide writes it.
    (tmp_path / "mysite" / "celery.py").write_text(textwrap.dedent("""
        import os

        from celery import Celery

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
        app = Celery("mysite")
        app.config_from_object("django.conf:settings", namespace="CELERY")
        app.autodiscover_tasks()
    """))
    (tmp_path / "mysite" / "__init__.py").write_text(
        "from .celery import app as celery_app\n\n__all__ = ['celery_app']\n")
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "mysite.settings", "KUBECONFIG": str(stack.kubeconfig),
           "DATABASE_URL": (f"postgres://{stack.db_user}:{stack.db_password}"
                            f"@127.0.0.1:{stack.postgres_port}/{database}"),
           "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}/9",
           "RECONCILERS_NAMESPACES": namespace, "RECONCILERS_APPLY_CRDS": "1",
           "RECONCILERS_LEASE_NAME": f"package-{namespace}",
           "OPERATOR_WATCHER_HTTP_PORT": "0", "OPERATOR_WORKER_HTTP_PORT": "0"}
    processes: list[subprocess.Popen] = []
    try:
        _run([python, "manage.py", "makemigrations", "accounts"], tmp_path, env)
        _run([python, "manage.py", "migrate", "--noinput"], tmp_path, env)
        # Its database bounds no wait on PostgreSQL: the check says so, and passes once the
        # project sets what its docs show (docs/writing/project.md).
        bare = subprocess.run([python, "manage.py", "check"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert bare.returncode == 0 and "reconcilers.W002" in bare.stderr, bare.stderr
        settings.write_text(settings.read_text() + textwrap.dedent("""
            DATABASES["default"]["OPTIONS"] = {
                "connect_timeout": 5, "keepalives": 1, "keepalives_idle": 10,
                "keepalives_interval": 5, "keepalives_count": 4, "tcp_user_timeout": 30000,
                "options": "-c statement_timeout=60000"}
        """))
        check = _run([python, "manage.py", "check"], tmp_path, env)
        assert "no issues" in check
        # The app's migrations are complete for a project that is not this repository's.
        _run([python, "manage.py", "makemigrations", "--check", "--dry-run"], tmp_path, env)
        # The project's own admin site is left as the project made it.
        site = _run([python, "-c", "import django; django.setup(); "
                     "from django.contrib import admin; from django.urls import reverse; "
                     "import mysite.urls; print(admin.site.site_header, admin.site.index_template)"],
                    tmp_path, env)
        assert site.strip() == "Django administration None"
        # The audit log points at the project's user model.
        field = _run([python, "-c", "import django; django.setup(); "
                      "from reconcilers.models import AuditLog; "
                      "print(AuditLog._meta.get_field('user').related_model._meta.label)"],
                     tmp_path, env)
        assert field.strip() == "accounts.Person"

        for name, argv in (("watcher", ["manage.py", "watch"]),
                           ("worker", ["-m", "celery", "-A", "mysite", "worker", "--pool",
                                       "prefork", "--concurrency", "1", "--without-gossip",
                                       "--without-mingle"])):
            with open(tmp_path / f"{name}.log", "wb") as log:
                processes.append(subprocess.Popen(
                    [python, *argv], cwd=tmp_path, env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True))
        try:
            _converges(kube, namespace, python, tmp_path, env)
        except AssertionError as exc:
            logs = "".join(f"\n--- {n} ---\n" + (tmp_path / f"{n}.log").read_text()[-3000:]
                           for n in ("watcher", "worker"))
            raise AssertionError(f"{exc}{logs}") from None
        for proc in processes:
            proc.terminate()
            proc.wait(30)

        # The project's own tests, with the test kit: one reconcile in-process, then the whole
        # operator around a block.
        _write_users_tests(tmp_path)
        out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests_mine"],
                   tmp_path, env, timeout=600)
        assert "2 passed" in out, out

        # The same tests with no cluster and no services of their own: the kit's --local-stack
        # brings up the packaged stack (PostgreSQL, Redis, etcd, kube-apiserver, controller
        # manager) on other ports before Django loads; the control plane binaries come from
        # the build cache, as they would on a developer's machine after the first run.
        own = {k: v for k, v in env.items() if k not in ("KUBECONFIG", "DATABASE_URL", "REDIS_URL")}
        own.update(_own_stack_ports(), OPERATOR_STATE_DIR=str(tmp_path / "own-stack"),
                   OPERATOR_CACHE_DIR=_build_cache())
        try:
            out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "reconcilers.testing", "--local-stack", "tests_mine"],
                       tmp_path, own, timeout=900)
            assert "2 passed" in out, out
            assert (tmp_path / "own-stack" / "kubeconfig").exists()
        finally:
            _run([python, "-m", "reconcilers.devstack", "down", "--purge"], tmp_path, own)
        assert not (tmp_path / "own-stack").exists()
    finally:
        for proc in processes:
            proc.terminate()
        for proc in processes:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        _admin_sql(stack, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def _own_stack_ports() -> dict[str, str]:
    import socket

    ports = {}
    for name in ("ETCD", "ETCD_PEER", "APISERVER", "POSTGRES", "REDIS"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[f"OPERATOR_{name}_PORT"] = str(s.getsockname()[1])
    return ports


def _build_cache() -> str:
    return os.environ.get("OPERATOR_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "django-crd-operator")


def _write_users_tests(project: Path) -> None:
    tests = project / "tests_mine"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "conftest.py").write_text('pytest_plugins = ["reconcilers.testing"]\n')
    (tests / "test_foo.py").write_text(textwrap.dedent("""
        import time

        from reconcilers.testing import api_get, api_request, reconcile_once, run_operator

        FOO = "foos.samplecontroller.k8s.io"


        def create_foo(api, namespace, name):
            api_request(api, "POST",
                        f"/apis/samplecontroller.k8s.io/v1alpha1/namespaces/{namespace}/foos",
                        {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
                         "metadata": {"name": name},
                         "spec": {"deploymentName": f"{name}-nginx", "replicas": 1}})


        def test_one_reconcile(kube_api, k8s_crds, k8s_namespace):
            assert "foos.samplecontroller.k8s.io" in k8s_crds
            create_foo(kube_api, k8s_namespace, "one")
            run = reconcile_once(FOO, k8s_namespace, "one")
            assert run.outcome == "success", run.error
            assert ("POST", "deployments") in [(w.method, w.kind) for w in run.writes]


        def test_the_operator_converges(kube_api, k8s_crds, k8s_namespace):
            with run_operator(k8s_namespace):
                create_foo(kube_api, k8s_namespace, "two")
                path = f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments/two-nginx"
                deadline = time.monotonic() + 60
                while api_get(kube_api, path) is None:
                    assert time.monotonic() < deadline, "never converged"
                    time.sleep(0.5)
    """))


def _converges(kube, namespace: str, python: Path, project: Path, env: dict) -> None:
    """A Foo gets its Deployment, and the run is in that project's history."""
    import time

    from kubernetes import client

    crds = client.ApiextensionsV1Api(kube)
    deadline = time.monotonic() + 120
    while True:  # the watcher applies the CRD of the reconciler the project enabled
        try:
            crds.read_custom_resource_definition("foos.samplecontroller.k8s.io")
            break
        except client.ApiException:
            assert time.monotonic() < deadline, "the watcher never applied the Foo CRD"
            time.sleep(1)
    time.sleep(2)  # established
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "samplecontroller.k8s.io", "v1alpha1", namespace, "foos",
        {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
         "metadata": {"name": "mine"}, "spec": {"deploymentName": "mine-nginx", "replicas": 1}})
    apps = client.AppsV1Api(kube)
    deadline = time.monotonic() + 120
    while True:
        try:
            deployment = apps.read_namespaced_deployment("mine-nginx", namespace)
            break
        except client.ApiException:
            assert time.monotonic() < deadline, "the project's operator never acted"
            time.sleep(1)
    assert deployment.metadata.owner_references[0].kind == "Foo"
    history = ""
    while time.monotonic() < deadline and "success" not in history:
        history = _run([python, "-c", "import django; django.setup(); "
                        "from reconcilers.models import ReconcileRecord; "
                        "print(list(ReconcileRecord.objects.values_list('name', 'outcome')))"],
                       project, env)
        time.sleep(1)
    assert "('mine', 'success')" in history, history
    # ... and in that project's own admin, as its staff would see it.
    page = _run([python, "-c", textwrap.dedent("""
        import django; django.setup()
        from django.test.utils import setup_test_environment; setup_test_environment()
        from django.contrib.auth import get_user_model
        from django.test import Client
        staff = get_user_model().objects.create_superuser("boss", "b@example.com", "pw")
        c = Client(); c.force_login(staff)
        r = c.get("/admin/reconcilers/reconcilerecord/", {"q": "mine"})
        print(r.status_code, b"foos.samplecontroller.k8s.io" in r.content,
              b">mine<" in r.content or b"/mine" in r.content)
    """)], project, env)
    assert page.split() == ["200", "True", "True"], page


def _admin_sql(stack, sql: str) -> None:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=stack.postgres_port, user=stack.db_user,
                         password=stack.db_password, dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(sql)
