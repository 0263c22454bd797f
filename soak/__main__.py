"""The chaos soak: ``python -m soak [--minutes M] [--seed S] [--faults all|proxy]`` (``make soak``).

Runs the whole operator - two watchers, three prefork workers, beat - on the local stack
against a few hundred ``SoakItem`` objects in several namespaces, while it keeps changing and
deleting objects and their children and, at random (seeded), kills workers and watchers (-9),
stops a worker past its lease (SIGSTOP/SIGCONT), injects network faults through a Toxiproxy
between the operator and PostgreSQL, Redis and the api-server, has the api-server answer 429
and 500, pauses the leading watcher past its Lease, makes reconciles block in C, rolls an
upgrade through every process, and (``--faults all``) restarts PostgreSQL, Redis (empty, and
from a stale snapshot) and the api-server (``soak.faults``). The operator runs as a
ServiceAccount of its own, its every connection through the proxy.

Each fault records the effect the soak saw of it. Then the faults stop, every live object
changes once more, and an independent checker (``soak.check``) asserts the promises from the
api-server, its audit log, the messages counted at the broker and the side channel the
reconciler writes, with the ledger and the history as secondary evidence, and fails on a
fault with no effect seen. Exit status 0 only when every check passed; the figures are
printed and written as JSON, and ``--write-docs`` writes them into docs/contributing/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reconcilers.devstack import config as stack_config  # noqa: E402
from reconcilers.devstack import controlplane  # noqa: E402
from soak import faults, report  # noqa: E402
from soak.toxiproxy import Toxiproxy, free_port  # noqa: E402

GROUP, VERSION, PLURAL = "soak.operator.local", "v1", "soakitems"
CRD = REPO / "soak" / "soakapp" / "crds" / "soakitems.soak.operator.local.yaml"
REDIS_DB = 7
MODES = ("all", "proxy")  # proxy: no restart of the stack's services (a shared stack)
# Seconds a message may wait in an idle worker's queue before its liveness probe fails: past
# every fault window (a worker cut off from the broker cannot tell, and is left alone).
STALLED_AFTER = 20


def _probe(port: int | None) -> tuple[str, str | None]:
    """A worker's ``/healthz`` as a kubelet reads it: ``("live", None)``, ``("not live",
    its 503 body)`` or ``("no answer", None)``."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
        return "live", None
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return "not live", exc.read().decode(errors="replace")[:300]
        return "no answer", None
    except OSError:
        return "no answer", None


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen | None = None
    env: dict = field(default_factory=dict)  # this process's own, over the operator's
    probe_port: int | None = None  # its /healthz, when the soak acts as its orchestrator

    def start(self, env: dict, logs: Path) -> None:
        log = open(logs / f"{self.name}.log", "ab")
        self.popen = subprocess.Popen(self.argv, cwd=REPO, env={**env, **self.env}, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        log.close()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(10)


@dataclass
class Soak:
    minutes: float
    seed: int
    objects: int
    namespaces: int
    work: Path
    pool: str = "prefork"  # the workers' Celery pool: prefork, or threads (the default layout)
    mode: str = "all"  # which faults: every kind, or none that restarts a shared service
    rng: random.Random = field(init=False)
    faults: dict = field(default_factory=dict)  # how many of each kind of change and fault
    injected: list = field(default_factory=list)  # every fault, with its effect (faults.Injected)
    changes: int = 0
    max_backlog: int = 0
    crashes: list = field(default_factory=list)  # processes that exited on their own
    worker_exits: list = field(default_factory=list)  # Celery workers that exited on their own
    stalled: list = field(default_factory=list)  # workers restarted: liveness probe failed
    probes: dict = field(default_factory=dict)  # per worker: how many probes answered what
    exits: list = field(default_factory=list)  # every exit on its own, with its explanation
    note: str = "initial"  # status.note every object must show (rolling_upgrade changes it)
    upgrades: int = 0
    leader_lease: float = 6
    procs: list[Proc] = field(default_factory=list)
    restarting: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.cfg = stack_config.load()
        self.run_id = f"{self.seed}-{uuid.uuid4().hex[:4]}"
        self.ns = [f"soak-{self.run_id}-{i}" for i in range(self.namespaces)]
        self.trace = self.work / "trace.log"
        self.db_url = self.cfg.database_url.rsplit("/", 1)[0] + "/operator_soak"
        self.redis_url = self.cfg.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
        self.messages = self.work / "messages.log"
        self.toxiproxy: Toxiproxy | None = None
        self.username = f"system:serviceaccount:{self.ns[0]}:soak-operator"

    def window(self) -> float:
        """How long one fault lasts: short when every kind must fit in CI's short soak."""
        return self.rng.uniform(3, 5) if self.minutes < 3 else self.rng.uniform(4, 15)

    def identity_subject(self) -> dict:
        return {"kind": "ServiceAccount",
                "serviceAccount": {"name": "soak-operator", "namespace": self.ns[0]}}

    def through_proxy(self, url: str, name: str) -> str:
        """``url`` with its port replaced by the proxy's."""
        scheme, rest = url.split("://", 1)
        auth, _, hostpath = rest.rpartition("@")
        hostport, _, path = hostpath.partition("/")
        host = hostport.rsplit(":", 1)[0]
        return f"{scheme}://{auth + '@' if auth else ''}{host}:{self.toxiproxy.listen[name]}/{path}"

    # --- set-up ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The operator's: every service through the proxy, as the soak's ServiceAccount."""
        return {**os.environ, "DJANGO_SETTINGS_MODULE": "soak.settings", "DEBUG": "1",
                "DATABASE_URL": self.through_proxy(self.db_url, "postgres"),
                "REDIS_URL": self.through_proxy(self.redis_url, "redis"),
                "KUBECONFIG": str(self.work / "operator.kubeconfig"), "PYTHONUNBUFFERED": "1",
                "SOAK_TRACE": str(self.trace), "SOAK_MESSAGES": str(self.messages),
                "SOAK_NOTE": self.note, "LOG_LEVEL": "WARNING", "OPERATOR_SAMPLES": "0",
                # Several watchers and workers on one host: no HTTP endpoints to collide.
                "OPERATOR_WATCHER_HTTP_PORT": "0", "OPERATOR_WORKER_HTTP_PORT": "0",
                "RECONCILERS_NAMESPACES": ",".join(self.ns),
                "RECONCILERS_LEASE_NAME": f"soak-{self.run_id}",
                "RECONCILERS_REAPER_INTERVAL": "1", "RECONCILERS_REDISPATCH_AFTER": "5",
                "RECONCILERS_LEADER_LEASE_SECONDS": f"{self.leader_lease:g}",
                "RECONCILERS_BACKOFF_BASE": "0.05", "RECONCILERS_BACKOFF_MAX": "5",
                "RECONCILERS_WORKER_STALLED_AFTER": f"{STALLED_AFTER:g}"}

    def setup(self) -> None:
        import psycopg
        import redis

        if not controlplane.ready(self.cfg):
            raise SystemExit("the local control plane is not up: run `make up` first")
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        self.trace.write_text("")
        self.messages.write_text("")
        self.start_proxy()
        admin = self.cfg.database_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "operator_soak" WITH (FORCE)')
            conn.execute('CREATE DATABASE "operator_soak"')
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                       cwd=REPO, env=self.env(), check=True, timeout=300)
        redis.Redis.from_url(self.redis_url).flushdb()
        self.kubectl("apply", "--server-side", "-f", str(CRD))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     f"crd/{PLURAL}.{GROUP}")
        for ns in self.ns:
            self.kubectl("create", "namespace", ns)
        self.operator_identity()
        per_ns = max(1, self.objects // self.namespaces)
        self.names = {ns: [f"item-{i}" for i in range(per_ns)] for ns in self.ns}
        docs = [self.item(ns, name, self.rng.randint(0, 9), self.rng.randint(0, 3))
                for ns, names in self.names.items() for name in names]
        self.kubectl_apply(docs)

    def start_proxy(self) -> None:
        self.toxiproxy = Toxiproxy(self.work / "logs" / "toxiproxy.log")
        self.toxiproxy.proxy("postgres", self.cfg.postgres_port)
        self.toxiproxy.proxy("redis", self.cfg.redis_port)
        self.toxiproxy.proxy("api-server", self.cfg.apiserver_port)

    def operator_identity(self) -> None:
        """A ServiceAccount of the soak's own (cluster-admin), so the faults that act on the
        api-server's side (APF, a webhook) can match the soak's operator and nothing else; its
        kubeconfig names the proxy (the serving certificate covers 127.0.0.1, any port)."""
        sa_ns = self.ns[0]
        self.kubectl("-n", sa_ns, "create", "serviceaccount", "soak-operator")
        self.kubectl("create", "clusterrolebinding", f"soak-{self.run_id}",
                     "--clusterrole", "cluster-admin",
                     f"--serviceaccount={sa_ns}:soak-operator")
        token = self.kubectl("-n", sa_ns, "create", "token", "soak-operator",
                             "--duration", "12h").stdout.strip()
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "soak",
               "clusters": [{"name": "soak", "cluster": {
                   "server": f"https://127.0.0.1:{self.toxiproxy.listen['api-server']}",
                   "certificate-authority": str(self.cfg.pki_dir / "ca.crt")}}],
               "users": [{"name": "soak-operator", "user": {"token": token}}],
               "contexts": [{"name": "soak", "context": {"cluster": "soak",
                                                         "user": "soak-operator"}}]}
        path = self.work / "operator.kubeconfig"
        path.write_text(json.dumps(doc, indent=2))
        path.chmod(0o600)

    def item(self, ns: str, name: str, value: int, children: int) -> dict:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SoakItem",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"value": value, "children": children}}

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(controlplane.binary_dir() / "kubectl"), *args],
                              env={**os.environ, "KUBECONFIG": str(self.cfg.kubeconfig)},
                              capture_output=True, text=True, check=check, timeout=120)

    def kubectl_apply(self, docs: list[dict]) -> None:
        path = self.work / "apply.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        for attempt in range(30):  # the api-server may be restarting
            if self.kubectl("apply", "-f", str(path), check=False).returncode == 0:
                return
            time.sleep(1)
        raise RuntimeError("kubectl apply kept failing")

    def start_operator(self) -> None:
        py = sys.executable
        self.watchers = [Proc(f"watcher{i}", [py, "manage.py", "watch"]) for i in range(2)]
        self.workers = [Proc(f"worker{i}", [
            py, "-m", "celery", "-A", "operator_project", "worker", "--loglevel", "WARNING",
            "--pool", self.pool, "--concurrency", "2", "--hostname", f"soak{i}-%h",
            "--without-gossip", "--without-mingle"]) for i in range(3)]
        for worker in self.workers:  # each serves /healthz, which the soak probes as k8s would
            worker.probe_port = free_port()
            worker.env["OPERATOR_WORKER_HTTP_PORT"] = str(worker.probe_port)
        self.beat = Proc("beat", [py, "-m", "celery", "-A", "operator_project", "beat",
                                  "--loglevel", "WARNING", "--schedule",
                                  str(self.work / "beat-schedule")])
        self.procs = [*self.watchers, *self.workers, self.beat]
        for p in self.procs:
            p.start(self.env(), self.work / "logs")
        self.probing = threading.Event()
        threading.Thread(target=self.probe_liveness, daemon=True).start()

    def probe_liveness(self) -> None:
        """The orchestrator's liveness probe, until the soak stops: a worker whose ``/healthz``
        answers 503 three times in a row (its consumer stalled: a message waiting next in its
        queue, none received and nothing running) is killed and started again, as a kubelet
        does. Only an answer counts: a worker that does not answer (stopped by a fault) is left alone, as the fault intends."""
        failures: dict[str, int] = {}
        while not self.probing.wait(2):
            for worker in self.workers:
                answer, why = _probe(worker.probe_port)
                tally = self.probes.setdefault(worker.name, {})
                tally[answer] = tally.get(answer, 0) + 1
                failures[worker.name] = failures.get(worker.name, 0) + 1 if why else 0
                if failures[worker.name] < 3:
                    continue
                failures[worker.name] = 0
                with self.restarting:
                    worker.signal(signal.SIGCONT)
                    worker.signal(signal.SIGKILL)
                    worker.popen.wait(10)
                    self.stalled.append(f"{worker.name} restarted: {why}")
                    worker.start(self.env(), self.work / "logs")

    # --- chaos -----------------------------------------------------------------------------

    def count(self, kind: str) -> None:
        """A change or fault of ``kind``, for the report's table."""
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def record(self, fault: faults.Injected) -> None:
        """A fault injected, with what was seen of it (``soak.faults``)."""
        self.injected.append(fault)
        self.count(fault.kind)

    def change_objects(self) -> None:
        docs = []
        for _ in range(self.rng.randint(1, 8)):
            ns = self.rng.choice(self.ns)
            if not self.names[ns]:
                continue
            name = self.rng.choice(self.names[ns])
            docs.append(self.item(ns, name, self.rng.randint(0, 99), self.rng.randint(0, 4)))
        if docs:
            self.kubectl_apply(docs)
            self.changes += len(docs)

    def change_every_object(self) -> None:
        """A new spec for every live object (the checker's last change, once faults stopped)."""
        self.kubectl_apply([self.item(ns, name, self.rng.randint(100, 199),
                                      self.rng.randint(0, 4))
                            for ns, names in self.names.items() for name in names])
        self.count("last change to every live object (after the faults)")

    def delete_object(self) -> None:
        ns = self.rng.choice(self.ns)
        if len(self.names[ns]) > 1:
            i = self.rng.randrange(len(self.names[ns]))
            name = self.names[ns][i]
            if self.kubectl("-n", ns, "delete", f"{PLURAL}.{GROUP}", name, "--wait=false",
                            check=False).returncode == 0:
                self.names[ns].pop(i)
                self.deleted.append((ns, name))
                self.count("objects deleted")

    def delete_child(self) -> None:
        ns = self.rng.choice(self.ns)
        out = self.kubectl("-n", ns, "get", "configmaps", "-o", "name", check=False).stdout
        children = [line for line in out.split() if "item-" in line]
        if children:
            if self.kubectl("-n", ns, "delete", self.rng.choice(children), "--wait=false",
                            check=False).returncode == 0:
                self.count("children deleted behind the operator's back")

    def kill(self, group: list[Proc], what: str) -> None:
        self.supervise()  # a process that already exited on its own is counted as such
        started = time.time()
        victim = self.rng.choice(group)
        pid = victim.popen.pid
        victim.signal(signal.SIGCONT)  # one paused by another fault must still die now
        victim.signal(signal.SIGKILL)
        code = victim.popen.wait(10)
        victim.start(self.env(), self.work / "logs")
        self.record(faults.Injected(f"{what} killed (-9)", started, time.time(),
                                    f"{victim.name} (pid {pid}) ended by SIGKILL"
                                    if code == -signal.SIGKILL else None))

    def actions(self) -> list[tuple[object, float]]:
        """What the chaos loop does, with its weight: changes first, then every fault this
        mode allows."""
        actions = [(self.change_objects, 30), (self.delete_object, 6), (self.delete_child, 6),
                   (lambda: self.kill(self.workers, "worker"), 4),
                   (lambda: self.kill(self.watchers, "watcher"), 3),
                   (lambda: faults.stop_worker_past_its_lease(self), 2)]
        for proxy in faults.SERVICES:
            for fault in ("latency", "black hole", "reset", "data limit"):
                actions.append(((lambda p=proxy, f=fault: faults.proxy_fault(self, p, f)),
                                0.4))
        actions += [(lambda: faults.api_throttled(self), 1),
                    (lambda: faults.api_failing(self), 1),
                    (lambda: faults.pause_leader(self), 1),
                    (lambda: faults.block_in_c(self), 1),
                    (lambda: faults.rolling_upgrade(self), 0.5)]
        if self.mode == "all":
            actions += [(lambda: faults.restart_postgres(self), 1),
                        (lambda: faults.restart_redis(self), 1),
                        (lambda: faults.restart_apiserver(self), 1),
                        (lambda: faults.redis_stale_snapshot(self), 0.5)]
        return actions

    def chaos(self, each_fault: bool = False) -> None:
        self.deleted: list[tuple[str, str]] = []
        funcs, weights = zip(*self.actions())
        deadline = time.monotonic() + self.minutes * 60
        done = threading.Event()
        threading.Thread(target=self.sample_backlog, args=(done,), daemon=True).start()
        try:
            if each_fault:  # every kind of fault at least once, in a seeded order, then random
                for fault in self.rng.sample(funcs[1:], len(funcs) - 1):
                    self.change_objects()
                    fault()
                    self.supervise()
            while time.monotonic() < deadline:
                self.rng.choices(funcs, weights)[0]()
                time.sleep(self.rng.uniform(0.2, 1.5))
                self.supervise()
        finally:
            done.set()

    def sample_backlog(self, done: threading.Event) -> None:
        """The broker's queue length, twice a second, faults or not (read directly)."""
        import redis

        broker = redis.Redis.from_url(self.redis_url, socket_timeout=2)
        while not done.wait(0.5):
            try:
                self.max_backlog = max(self.max_backlog, broker.llen("celery"))
            except redis.RedisError:
                pass  # restarting

    def supervise(self) -> None:
        """Restart a process that exited on its own, as compose or Kubernetes would - and
        remember it: the operator's processes must ride out every fault here."""
        with self.restarting:
            self._supervise()

    def _supervise(self) -> None:
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                self.exits.append((p.name, code, report.explain_exit(
                    code, self.work / "logs" / f"{p.name}.log")))
                # Counted apart: a worker may exit by design (too many abandoned runs, a
                # stall that outlasted its bound), the operator's own processes never.
                (self.worker_exits if p in self.workers else self.crashes).append(
                    f"{p.name} exited with {code}")
                p.start(self.env(), self.work / "logs")

    # --- the end -----------------------------------------------------------------------------

    def dump_stacks(self) -> None:
        """Every live process's Python stacks (py-spy), written beside its log as
        ``<name>.stacks``: what the operator was doing when a check failed."""
        spy = Path(sys.executable).parent / "py-spy"
        if not spy.exists():
            return
        for p in self.procs:
            if not p.popen or p.popen.poll() is not None:
                continue
            children = subprocess.run(["pgrep", "-P", str(p.popen.pid)], capture_output=True,
                                      text=True).stdout.split()
            dumps = []
            for pid in [str(p.popen.pid), *children]:
                try:
                    out = subprocess.run([str(spy), "dump", "--pid", pid], capture_output=True,
                                         text=True, timeout=30)
                    dumps.append(out.stdout + out.stderr)
                except subprocess.TimeoutExpired:
                    dumps.append(f"py-spy dump --pid {pid}: no answer in 30 s\n")
            (self.work / "logs" / f"{p.name}.stacks").write_text("\n".join(dumps))

    def stop(self) -> None:
        if hasattr(self, "probing"):
            self.probing.set()
        for p in self.procs:
            p.signal(signal.SIGCONT)
            p.stop()
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
        self.kubectl("delete", "clusterrolebinding", f"soak-{self.run_id}", "--wait=false",
                     check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--namespaces", type=int, default=3)
    parser.add_argument("--settle", type=float, default=180,
                        help="seconds to let the operator converge after the faults stop")
    parser.add_argument("--each-fault", action="store_true",
                        help="inject every kind of fault at least once (CI's short soak)")
    parser.add_argument("--pool", choices=["prefork", "threads"], default="prefork",
                        help="the workers' Celery pool (threads: the default layout's)")
    parser.add_argument("--faults", choices=MODES, default="all",
                        help="all: every kind; proxy: none that restarts PostgreSQL, Redis or "
                             "the api-server (for a stack others use)")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the figures into the measured section of "
                        "docs/contributing/reliability.md")
    parser.add_argument("--work", type=Path, default=REPO / ".local" / "soak")
    parser.add_argument("--report", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)

    soak = Soak(args.minutes, args.seed, args.objects, args.namespaces, args.work, args.pool,
                args.faults)
    print(f"soak: seed {args.seed}, {args.minutes:g} min, {args.objects} objects in "
          f"{args.namespaces} namespaces, {args.pool} workers, faults: {args.faults}; "
          f"logs in {args.work}", flush=True)
    started = time.monotonic()
    code = report.commit()  # at the start: others may commit while it runs
    try:  # whatever fails, the soak's processes, proxy and cluster objects go
        soak.setup()
        soak.start_operator()
        soak.chaos(each_fault=args.each_fault)
        soak.supervise()
        # The checker reads the services directly, as the stack's admin.
        os.environ.update({"DJANGO_SETTINGS_MODULE": "soak.settings", "DEBUG": "1",
                           "DATABASE_URL": soak.db_url, "REDIS_URL": soak.redis_url,
                           "KUBECONFIG": str(soak.cfg.kubeconfig)})
        from soak import check

        result = check.run(soak, settle=args.settle)
        if not result["passed"]:
            soak.dump_stacks()
    finally:
        soak.stop()
        for ns in soak.ns:
            soak.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    result.update({"seed": args.seed, "minutes": args.minutes, "pool": args.pool,
                   "fault mode": args.faults, "objects requested": args.objects,
                   "commit": code, "faults": soak.faults,
                   "changes": soak.changes, "seconds": round(time.monotonic() - started)})
    print(json.dumps(result, indent=2), flush=True)
    if not result["audit log"]["ran"]:
        print(f"soak: the audit-log check was NOT RUN ({result['audit log']['why not']}); "
              "the soak does not pass without it", flush=True)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(result, indent=2) + "\n")
    if args.write_docs:
        report.write_docs(result, REPO / "docs" / "contributing" / "reliability.md")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
