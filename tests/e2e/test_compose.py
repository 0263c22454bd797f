"""The compose path, the way users run it: the real Dockerfile and docker-compose.yml (plus
docker-compose.host-network.yml, because the local api-server listens on 127.0.0.1) against the
local control plane.

The Docker engine and the base images come from hack/docker-engine.sh and
hack/docker-base-images.sh (stand-ins for python:3.11-slim, postgres:17 and redis:7 where no
registry can be reached). Nothing is skipped: when Docker cannot start, the test fails and says
why. The env file is .env.example with this run's secrets, ports and paths filled in, so the
example itself is what gets tested. Every wait is bounded (generously: these machines
are shared); timings go to test-artifacts/logs/compose-timings.txt.

Compose defaults to Debian's docker-compose 1.29; OPERATOR_COMPOSE="docker compose" runs the
same test with Compose v2.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import textwrap
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Callable

import pytest

from reconcilers.devstack.process import pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "test-artifacts" / "logs"
IMAGE = "django-crd-operator:e2e"
COMPOSE = shlex.split(os.environ.get("OPERATOR_COMPOSE", "docker-compose"))
WATCH_COMMAND = REPO / "reconcilers" / "management" / "commands" / "watch.py"


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`{shlex.join(argv)}` did not finish within {timeout}s:\n"
                    f"{(exc.stdout or b'')[-3000:]!r}\n{(exc.stderr or b'')[-3000:]!r}",
                    pytrace=False)
    if check and result.returncode != 0:
        pytest.fail(f"`{shlex.join(argv)}` exited {result.returncode}:\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    return result


def _wait(what: str, condition: Callable[[], bool], timeout: float, interval: float = 1,
          diagnose: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, ValueError):
            pass
        time.sleep(interval)
    pytest.fail(f"{what} within {timeout}s\n{diagnose()}", pytrace=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flattened_kubeconfig(source: Path, target: Path) -> Path:
    """A self-contained copy (``kubectl config view --flatten``): files become inline data,
    because the container sees only the mounted kubeconfig, not the files it points to."""
    import yaml

    config = yaml.safe_load(source.read_text())
    for entry, key in [(c["cluster"], "certificate-authority") for c in config["clusters"]] + [
            (u["user"], k) for u in config["users"] for k in ("client-certificate", "client-key")]:
        if key in entry:
            entry[f"{key}-data"] = base64.b64encode(Path(entry.pop(key)).read_bytes()).decode()
    target.write_text(json.dumps(config))
    target.chmod(0o644)  # readable by the image's uid 10001
    return target


def env_file_from_example(target: Path, values: dict[str, str]) -> Path:
    """.env.example with ``values`` substituted; every key must already be documented there."""
    lines = (REPO / ".env.example").read_text().splitlines()
    documented = {line.split("=", 1)[0] for line in lines if re.match(r"^[A-Z_]+=", line)}
    assert not set(values) - documented, f"undocumented in .env.example: {set(values) - documented}"
    out = []
    for line in lines:
        key = line.split("=", 1)[0]
        out.append(f"{key}={values[key]}" if key in values else line)
    target.write_text("\n".join(out) + "\n")
    return target


@dataclass
class Compose:
    """One compose project; ``web``, ``redis_url`` and the admin password are this run's."""

    project: str
    env_file: Path
    web: str
    redis_url: str
    admin_password: str
    files: tuple[str, ...] = ("docker-compose.yml", "docker-compose.host-network.yml")
    timings: dict[str, float] = field(default_factory=dict)

    def __call__(self, *args: str, timeout: float = 120, check: bool = True
                 ) -> subprocess.CompletedProcess:
        argv = [*COMPOSE, "--project-name", self.project, "--env-file", str(self.env_file)]
        for f in self.files:
            argv += ["-f", f]
        # Only what compose needs: this test run's own settings must not leak into the stack.
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "HOME", "LANG") or k.startswith("DOCKER_")}
        return _run([*argv, *args], timeout, env=env, check=check)

    def containers(self, service: str) -> list[str]:
        return self("ps", "-a", "-q", service).stdout.split()

    def state(self, container: str) -> dict:
        out = _run(["docker", "inspect", "-f", "{{json .State}}", container], 30).stdout
        return json.loads(out)

    def healthy(self, service: str, count: int = 1) -> bool:
        ids = self.containers(service)
        return len(ids) == count and all(
            self.state(c).get("Health", {}).get("Status") == "healthy" for c in ids)

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "80", timeout=60, check=False).stdout

    def diagnose(self) -> str:
        """The last healthcheck output of every container, then the logs."""
        lines = []
        for container in self("ps", "-a", "-q").stdout.split():
            state = self.state(container)
            checks = state.get("Health", {}).get("Log", [])[-1:]
            lines.append(f"{container[:12]} {state['Status']} exit={state['ExitCode']} "
                         + " ".join(c["Output"].strip()[-300:] for c in checks))
        return "\n".join(lines) + "\n" + self.logs()[-8000:]

    def timed(self, name: str, started: float) -> None:
        self.timings[name] = round(time.monotonic() - started, 1)


@pytest.fixture(scope="module")
def project_image() -> dict[str, float]:
    """The engine, the stand-in base images and the project image, each step timed."""
    timings = {}
    for name, argv, timeout in [
        ("docker engine", ["bash", "hack/docker-engine.sh"], 300),
        ("base images", ["bash", "hack/docker-base-images.sh"], 900),
        ("project image", ["docker", "build", "--network", "host", "-t", IMAGE, "."], 900),
    ]:
        started = time.monotonic()
        result = _run(argv, timeout, env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=False)
        if result.returncode != 0:
            pytest.fail(f"{name}: `{shlex.join(argv)}` failed (exit {result.returncode}); "
                        f"the compose path cannot be tested without it:\n"
                        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
        timings[name] = round(time.monotonic() - started, 1)
    return timings


@pytest.fixture
def compose(request, project_image, stack, namespace, tmp_path):
    admin_password = secrets.token_urlsafe(16)
    redis_password = secrets.token_urlsafe(16)
    ports = {"WEB_PORT": _free_port(), "POSTGRES_HOST_PORT": _free_port(),
             "REDIS_HOST_PORT": _free_port(), "WEBHOOK_PORT": _free_port()}
    env_file = env_file_from_example(tmp_path / "compose.env", {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "REDIS_PASSWORD": redis_password,
        "DJANGO_SUPERUSER_USERNAME": "e2e-admin",
        "DJANGO_SUPERUSER_PASSWORD": admin_password,
        "KUBECONFIG_PATH": str(flattened_kubeconfig(stack.kubeconfig, tmp_path / "kubeconfig")),
        "OPERATOR_IMAGE": IMAGE,
        "OPERATOR_SAMPLES": "1",
        # Only this test's namespace: the stack must not touch other tests' objects.
        "RECONCILERS_NAMESPACES": namespace,
        "RECONCILERS_LEASE_NAMESPACE": namespace,
        "HEALTHCHECK_INTERVAL": "5s",
        # The webhook server too, judging only this test's namespace (labelled by the test).
        "COMPOSE_PROFILES": "webhook",
        "WEBHOOK_HOST": "127.0.0.1",
        "WEBHOOK_NAMESPACE_LABEL": f"webhook-test={namespace}",
        **{k: str(v) for k, v in ports.items()},
    })
    project = Compose(f"dco-e2e-{secrets.token_hex(3)}", env_file,
                      web=f"http://127.0.0.1:{ports['WEB_PORT']}",
                      redis_url=f"redis://:{redis_password}@127.0.0.1:{ports['REDIS_HOST_PORT']}/0",
                      admin_password=admin_password, timings=dict(project_image))
    yield project
    LOGS.mkdir(parents=True, exist_ok=True)
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        logs = project.logs()
        (LOGS / "compose-e2e.log").write_text(logs)
        print(f"\n--- compose logs (also in {LOGS / 'compose-e2e.log'}) ---\n{logs}")
    started = time.monotonic()
    project("down", "-v", "--remove-orphans", "--timeout", "20", timeout=180)
    project.timed("compose down -v", started)
    (LOGS / "compose-timings.txt").write_text(
        "".join(f"{k}: {v}s\n" for k, v in project.timings.items()))


def _admin_login(base: str, username: str, password: str,
                 opener=None) -> tuple[int, str, str]:
    """Log in through the login form as a browser would; (status, final URL, page)."""
    opener = opener or urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(CookieJar()))
    with opener.open(f"{base}/admin/login/?next=/admin/", timeout=10) as response:
        page = response.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": username,
                                   "password": password, "next": "/admin/"}).encode()
    with opener.open(f"{base}/admin/login/?next=/admin/", data=form, timeout=10) as response:
        return response.status, response.url, response.read().decode()


def _ping_workers(redis_url: str) -> set[str]:
    from celery import Celery

    app = Celery("compose-e2e", broker=redis_url)
    try:
        return {node for reply in app.control.ping(timeout=3) for node in reply}
    finally:
        app.close()


DOCKER_PIDFILE = Path("/var/run/docker.pid")
CONTAINERD_PIDFILE = Path("/var/run/docker/containerd/containerd.pid")


def test_the_engine_starts_over_pid_files_a_killed_engine_left():
    """A machine whose processes were killed at once (a CI runner reset, a host crash) keeps
    dockerd's and its containerd's pid files. Once an unrelated process reuses such a number,
    dockerd trusts the file: it refuses to start, or waits on a containerd that is not there
    ("containerd is still running", then "timeout waiting for containerd to start").
    hack/docker-engine.sh must start the engine anyway, and leave the unrelated process be.
    This test restarts the local engine, which only the compose tests use."""
    _run(["bash", "hack/docker-engine.sh"], 300)
    engine = int(DOCKER_PIDFILE.read_text().strip())
    os.kill(engine, signal.SIGTERM)
    _wait("dockerd stops on SIGTERM", lambda: not pid_alive(engine), 120)
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        CONTAINERD_PIDFILE.parent.mkdir(parents=True, exist_ok=True)
        for pidfile in (DOCKER_PIDFILE, CONTAINERD_PIDFILE):
            pidfile.write_text(str(bystander.pid))
        _run(["bash", "hack/docker-engine.sh"], 300)
        assert _run(["docker", "info", "--format", "{{.ServerVersion}}"], 60).stdout.strip()
        assert bystander.poll() is None, "the script killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()


def test_compose_runs_every_role_against_the_local_control_plane(compose, kube, namespace):
    from kubernetes import client

    client.CoreV1Api(kube).patch_namespace(namespace, {"metadata": {"labels": {
        "webhook-test": namespace}}})
    started = time.monotonic()
    compose("up", "-d", "--no-build", timeout=600)
    compose.timed("compose up -d", started)

    def readyz() -> bool:
        with urllib.request.urlopen(f"{compose.web}/readyz", timeout=10) as response:
            return response.status == 200 and json.load(response)["status"] == "ready"

    _wait("web never answered /readyz with 200", readyz, timeout=300, diagnose=compose.diagnose)
    compose.timed("up until /readyz is 200", started)

    # migrate ran once and succeeded; its admin user logs in over HTTP.
    (migrate,) = compose.containers("migrate")
    assert compose.state(migrate)["Status"] == "exited"
    assert compose.state(migrate)["ExitCode"] == 0
    status, url, page = _admin_login(compose.web, "e2e-admin", compose.admin_password)
    assert status == 200 and url.endswith("/admin/"), url
    assert "Site administration" in page and "Log out" in page

    # Static files are collected into the image and served by whitenoise, hashed and cacheable.
    css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page).group(1)
    with urllib.request.urlopen(f"{compose.web}{css}", timeout=10) as response:
        assert response.status == 200
        assert "immutable" in response.headers["Cache-Control"]

    # The worker consumes: the health command's control ping inside its container, and the
    # compose healthcheck built on it.
    health = compose("exec", "-T", "worker", "python", "manage.py", "health", "worker",
                     "--timeout", "10")
    assert "worker healthy" in health.stdout
    _wait("web and worker never became healthy", lambda: compose.healthy("web")
          and compose.healthy("worker"), timeout=300, diagnose=compose.diagnose)
    compose.timed("up until web and worker healthy", started)

    if WATCH_COMMAND.exists():
        _wait("the watcher never became healthy", lambda: compose.healthy("watcher"),
              timeout=300, diagnose=compose.diagnose)
    # else: `manage.py watch` does not exist yet, so the watcher container restarts; tolerated.

    # Scaling: a second worker with its own node name, both consuming.
    started = time.monotonic()
    compose("up", "-d", "--no-build", "--scale", "worker=2", timeout=300)
    _wait("two workers never both became healthy", lambda: compose.healthy("worker", count=2),
          timeout=300, diagnose=compose.diagnose)
    compose.timed("scale to 2 workers until healthy", started)
    for index in ("1", "2"):
        compose("exec", "-T", "--index", index, "worker", "python", "manage.py", "health",
                "worker", "--timeout", "10")
    answered: set[str] = set()

    def both_answer() -> bool:
        answered.clear()
        answered.update(_ping_workers(compose.redis_url))
        return len(answered) == 2

    _wait("two distinct worker nodes never answered a ping", both_answer, timeout=60)
    assert all(node.startswith("worker-") for node in answered), answered

    # The cache the workers trust as cluster state is not writable without the password.
    import redis

    anonymous = redis.Redis.from_url(compose.redis_url.replace(
        compose.redis_url.split("@")[0] + "@", "redis://"))
    with pytest.raises(redis.AuthenticationError):
        anonymous.set("operator:obj:forged", "{}")

    # No beat in the default layout: the leading watcher sends the periodic tasks, which the
    # workers run (the reaper every RECONCILERS_REAPER_INTERVAL).
    assert compose.containers("beat") == []
    _wait("the watcher never sent the reaper", lambda: "reconcilers.reap" in compose(
        "logs", "--no-color", "worker", timeout=60).stdout, timeout=60, diagnose=compose.diagnose)

    # The sample operator, end to end inside the containers.
    foos = client.CustomObjectsApi(kube)
    apps = client.AppsV1Api(kube)
    foos.create_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace, "foos", {
        "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": {"name": "compose-foo"},
        "spec": {"deploymentName": "compose-foo", "replicas": 2}})

    def deployment_replicas() -> int | None:
        try:
            dep = apps.read_namespaced_deployment("compose-foo", namespace)
        except client.ApiException:
            return None
        assert [r.kind for r in dep.metadata.owner_references] == ["Foo"]
        return dep.spec.replicas

    _wait("the Foo's Deployment never appeared", lambda: deployment_replicas() == 2,
          timeout=120, diagnose=compose.diagnose)
    _wait("the Foo's status was never written", lambda: "status" in foos.get_namespaced_custom_object(
        "samplecontroller.k8s.io", "v1alpha1", namespace, "foos", "compose-foo"), timeout=60)

    # The run is in the admin's history, over HTTP.
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    _admin_login(compose.web, "e2e-admin", compose.admin_password, opener)

    def history(query: str) -> str:
        with opener.open(f"{compose.web}/admin/reconcilers/reconcilerecord/?{query}",
                         timeout=10) as response:
            return response.read().decode()

    _wait("the run never showed in the admin history",
          lambda: "compose-foo" in history("q=compose-foo&outcome__exact=success"), timeout=60)

    # A manual resync through the admin's form: audited, and its run appears with `manual`.
    form_url = f"{compose.web}/admin/reconcilers/registeredreconciler/resync-object/"
    with opener.open(form_url, timeout=10) as response:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"',
                          response.read().decode()).group(1)
    data = urllib.parse.urlencode({
        "csrfmiddlewaretoken": token, "reconciler": "foos.samplecontroller.k8s.io",
        "namespace": namespace, "name": "compose-foo"}).encode()
    request = urllib.request.Request(form_url, data=data, headers={"Referer": form_url})
    with opener.open(request, timeout=10) as response:
        assert "enqueued for a manual resync" in response.read().decode()
    _wait("the manual run never showed in the admin history",
          lambda: "compose-foo" in history("q=compose-foo&trigger=manual"), timeout=60)

    # Kill one of the two workers while work is in flight: everything still converges.
    foos.patch_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace,
                                        "foos", "compose-foo", {"spec": {"replicas": 3}})
    victim = compose.containers("worker")[0]
    _run(["docker", "kill", "--signal", "KILL", victim], 60)
    _wait("the Deployment never converged after a worker was killed",
          lambda: deployment_replicas() == 3, timeout=180, diagnose=compose.diagnose)

    # The webhook server (COMPOSE_PROFILES=webhook) registered itself: a Foo without replicas
    # gets 1, a second Foo naming the same Deployment is refused; stopped, it unregisters.
    def create(name: str, deployment: str) -> dict:
        return foos.create_namespaced_custom_object(
            "samplecontroller.k8s.io", "v1alpha1", namespace, "foos",
            {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
             "metadata": {"name": name}, "spec": {"deploymentName": deployment}}, dry_run="All")

    _wait("the webhook server never became healthy", lambda: compose.healthy("webhook"),
          timeout=300, diagnose=compose.diagnose)
    _wait("the mutating webhook never answered",
          lambda: create("defaulted", "defaulted")["spec"].get("replicas") == 1, timeout=60,
          diagnose=compose.diagnose)
    with pytest.raises(client.ApiException) as denied:
        create("rival", "compose-foo")
    assert 'already named by Foo "compose-foo"' in json.loads(denied.value.body)["message"]
    compose("stop", "webhook", timeout=120)
    assert "django-crd-operator-validate" not in {
        c.metadata.name for c in
        client.AdmissionregistrationV1Api(kube).list_validating_webhook_configuration().items}


def test_the_image_carries_no_test_tools_and_no_kubeconfig(project_image):
    """Built from requirements.lock (what the image runs); the test tools are only in
    requirements-dev.lock, and .dockerignore keeps kubeconfigs and tests out of the context."""
    probe = ("import importlib.util, pathlib, sys; "
             "tools = [m for m in ('pytest', 'pytest_django', 'playwright') "
             "if importlib.util.find_spec(m)]; "
             "files = [str(p) for p in pathlib.Path('/app').rglob('*') "
             "if 'kubeconfig' in p.name or p.match('tests/fixtures.py')]; "
             "print(tools, files); sys.exit(bool(tools or files))")
    result = subprocess.run(["docker", "run", "--rm", "--network", "none", IMAGE, "python",
                             "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "[] []"


def test_the_image_runs_exactly_the_hashed_lock(project_image):
    """Every installed distribution is a lock entry whose marker holds for the image's Python
    (bookworm's 3.11.2 gets async-timeout), and every such entry is installed at its pin."""
    probe = textwrap.dedent(r"""
        import importlib.metadata as md, json, re, sys
        from packaging.requirements import Requirement
        text = re.sub(r"\\\n", " ", open("/app/requirements.lock").read())
        want = {}
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith(("#", "-")):
                req = Requirement(re.sub(r"\s*--hash=\S+", "", line))
                if req.marker is None or req.marker.evaluate():
                    want[req.name.lower().replace("_", "-")] = str(req.specifier)[2:]
        have = {d.metadata["Name"].lower().replace("_", "-"): d.version
                for d in md.distributions() if d.metadata["Name"] not in ("pip", "setuptools")}
        print(json.dumps({"python": list(sys.version_info[:3]), "want": want, "have": have}))
    """)
    result = subprocess.run(["docker", "run", "--rm", "--network", "none", IMAGE, "python",
                             "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["have"] == found["want"]
    assert ("async-timeout" in found["have"]) == (tuple(found["python"]) < (3, 11, 3))

def test_an_image_built_from_this_one_runs_its_own_app(project_image, tmp_path):
    """docs/running/compose.md, "Your apps in the image": FROM this image, COPY an app, name
    it in OPERATOR_APPS - the app's reconciler is registered and its RBAC rules are generated,
    no framework file edited."""
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "reconcilers.py").write_text(textwrap.dedent("""
        from reconcilers.api import Reconciler, register


        @register
        class GreetingReconciler(Reconciler):
            group, version, kind, plural = "", "v1", "ConfigMap", "configmaps"

            def reconcile(self, obj, ctx):
                return None
    """))
    (tmp_path / "Dockerfile").write_text(textwrap.dedent(f"""
        FROM {IMAGE}
        COPY myapp /app/myapp
        ENV OPERATOR_APPS=myapp
    """))
    derived = "django-crd-operator-derived:e2e"
    _run(["docker", "build", "-t", derived, str(tmp_path)], 300,
         env={**os.environ, "DOCKER_BUILDKIT": "0"})
    try:
        env = ["-e", "SECRET_KEY=derived-image-test", "-e",
               "DATABASE_URL=postgres://nobody@127.0.0.1:1/none", "-e", "REDIS_URL=redis://127.0.0.1:1/0"]
        probe = ("import django; django.setup(); "
                 "from reconcilers._authoring.registry import autodiscover, registry; autodiscover(); "
                 "print(' '.join(registry.names()))")
        names = _run(["docker", "run", "--rm", "--network", "none", *env, derived,
                      "python", "-c", probe], 120).stdout.split()
        assert "configmaps" in names, names
        rbac = _run(["docker", "run", "--rm", "--network", "none", *env, derived,
                     "python", "manage.py", "rbac"], 120).stdout
        assert "configmaps" in rbac, rbac
    finally:
        subprocess.run(["docker", "rmi", "-f", derived], capture_output=True, timeout=120)
