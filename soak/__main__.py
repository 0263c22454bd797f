"""The chaos soak: ``python -m soak [--minutes M] [--seed S]`` (``make soak``).

Runs the whole operator - two watchers, three prefork workers, beat - on the local stack
against a few hundred ``SoakItem`` objects in several namespaces, while it keeps changing and
deleting objects and their children and, at random (seeded), kills workers and watchers (-9),
stops a worker past its lease (SIGSTOP/SIGCONT), restarts PostgreSQL, Redis and the
api-server. Then the faults stop and an independent checker (``soak.check``) asserts the
promises from the cluster, the history and the side channel the reconciler writes. Exit
status 0 only when every check passed; the figures are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reconcilers.devstack import config as stack_config  # noqa: E402
from reconcilers.devstack import controlplane, process, services  # noqa: E402

GROUP, VERSION, PLURAL = "soak.operator.local", "v1", "soakitems"
CRD = REPO / "soak" / "soakapp" / "crds" / "soakitems.soak.operator.local.yaml"
REDIS_DB = 7
LEASE_SECONDS = 4  # the SoakItem reconciler's run deadline


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen | None = None

    def start(self, env: dict, logs: Path) -> None:
        log = open(logs / f"{self.name}.log", "ab")
        self.popen = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=log,
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
    rng: random.Random = field(init=False)
    faults: dict = field(default_factory=dict)
    changes: int = 0
    max_backlog: int = 0
    crashes: list = field(default_factory=list)  # processes that exited on their own
    worker_exits: list = field(default_factory=list)  # Celery workers that exited on their own
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.cfg = stack_config.load()
        self.run_id = f"{self.seed}-{uuid.uuid4().hex[:4]}"
        self.ns = [f"soak-{self.run_id}-{i}" for i in range(self.namespaces)]
        self.trace = self.work / "trace.log"
        self.db_url = self.cfg.database_url.rsplit("/", 1)[0] + "/operator_soak"
        self.redis_url = self.cfg.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"

    # --- set-up ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {**os.environ, "DJANGO_SETTINGS_MODULE": "soak.settings", "DEBUG": "1",
                "DATABASE_URL": self.db_url, "REDIS_URL": self.redis_url,
                "KUBECONFIG": str(self.cfg.kubeconfig), "PYTHONUNBUFFERED": "1",
                "SOAK_TRACE": str(self.trace), "LOG_LEVEL": "WARNING", "OPERATOR_SAMPLES": "0",
                # Several watchers and workers on one host: no HTTP endpoints to collide.
                "OPERATOR_WATCHER_HTTP_PORT": "0", "OPERATOR_WORKER_HTTP_PORT": "0",
                "RECONCILERS_NAMESPACES": ",".join(self.ns),
                "RECONCILERS_LEASE_NAME": f"soak-{self.run_id}",
                "RECONCILERS_REAPER_INTERVAL": "1", "RECONCILERS_REDISPATCH_AFTER": "5",
                "RECONCILERS_LEADER_LEASE_SECONDS": "6",
                "RECONCILERS_BACKOFF_BASE": "0.05", "RECONCILERS_BACKOFF_MAX": "5"}

    def setup(self) -> None:
        import psycopg
        import redis

        if not controlplane.ready(self.cfg):
            raise SystemExit("the local control plane is not up: run `make up` first")
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        self.trace.write_text("")
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
        per_ns = max(1, self.objects // self.namespaces)
        self.names = {ns: [f"item-{i}" for i in range(per_ns)] for ns in self.ns}
        docs = [self.item(ns, name, self.rng.randint(0, 9), self.rng.randint(0, 3))
                for ns, names in self.names.items() for name in names]
        self.kubectl_apply(docs)

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
        self.beat = Proc("beat", [py, "-m", "celery", "-A", "operator_project", "beat",
                                  "--loglevel", "WARNING", "--schedule",
                                  str(self.work / "beat-schedule")])
        self.procs = [*self.watchers, *self.workers, self.beat]
        for p in self.procs:
            p.start(self.env(), self.work / "logs")

    # --- chaos -----------------------------------------------------------------------------

    def count(self, fault: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

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

    def delete_object(self) -> None:
        ns = self.rng.choice(self.ns)
        if len(self.names[ns]) > 1:
            name = self.names[ns].pop(self.rng.randrange(len(self.names[ns])))
            self.kubectl("-n", ns, "delete", f"{PLURAL}.{GROUP}", name, "--wait=false",
                         check=False)
            self.deleted.append((ns, name))
            self.count("objects deleted")

    def delete_child(self) -> None:
        ns = self.rng.choice(self.ns)
        out = self.kubectl("-n", ns, "get", "configmaps", "-o", "name", check=False).stdout
        children = [line for line in out.split() if "item-" in line]
        if children:
            self.kubectl("-n", ns, "delete", self.rng.choice(children), "--wait=false",
                         check=False)
            self.count("children deleted behind the operator's back")

    def kill(self, group: list[Proc], what: str) -> None:
        self.supervise()  # a process that already exited on its own is counted as such
        victim = self.rng.choice(group)
        victim.signal(signal.SIGKILL)
        victim.popen.wait(10)
        victim.start(self.env(), self.work / "logs")
        self.count(f"{what} killed (-9)")

    def stop_worker_past_its_lease(self) -> None:
        victim = self.rng.choice(self.workers)
        victim.signal(signal.SIGSTOP)
        time.sleep(LEASE_SECONDS * 2 + 3)
        victim.signal(signal.SIGCONT)
        self.count("worker stopped past its lease (SIGSTOP)")

    def restart_postgres(self) -> None:
        """A fast shutdown (every client cut off at once), a pause, a start."""
        services.stop_postgres(self.cfg)
        time.sleep(self.rng.uniform(0.5, 3))
        services.start_postgres(self.cfg)
        self.count("PostgreSQL restarted")

    def restart_redis(self) -> None:
        services.stop_redis(self.cfg)
        time.sleep(self.rng.uniform(0.5, 2))
        services.start_redis(self.cfg)  # empty: no persistence
        self.count("Redis restarted (empty)")

    def restart_apiserver(self) -> None:
        process.stop("kube-apiserver", self.cfg.run_dir)
        time.sleep(self.rng.uniform(0.5, 2))
        controlplane.start(self.cfg)
        self.count("api-server restarted (every watch dropped)")

    def chaos(self, each_fault: bool = False) -> None:
        self.deleted: list[tuple[str, str]] = []
        actions = [(self.change_objects, 30), (self.delete_object, 6), (self.delete_child, 6),
                   (lambda: self.kill(self.workers, "worker"), 4),
                   (lambda: self.kill(self.watchers, "watcher"), 3),
                   (self.stop_worker_past_its_lease, 2), (self.restart_postgres, 1),
                   (self.restart_redis, 1), (self.restart_apiserver, 1)]
        funcs, weights = zip(*actions)
        deadline = time.monotonic() + self.minutes * 60
        if each_fault:  # every kind of fault at least once, in a seeded order, then at random
            for fault in self.rng.sample(funcs[1:], len(funcs) - 1):
                self.change_objects()
                fault()
                self.supervise()
        import redis

        broker = redis.Redis.from_url(self.redis_url, socket_timeout=2)
        while time.monotonic() < deadline:
            self.rng.choices(funcs, weights)[0]()
            time.sleep(self.rng.uniform(0.2, 1.5))
            try:
                self.max_backlog = max(self.max_backlog, broker.llen("celery"))
            except redis.RedisError:
                pass  # restarting
            self.supervise()

    def supervise(self) -> None:
        """Restart a process that exited on its own, as compose or Kubernetes would - and
        remember it: the operator's processes must ride out every fault here."""
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                # Celery's own consumer can die when Redis restarts under it (a kombu bug in
                # the pidbox's pub/sub reconnect: "Unrecoverable error: AttributeError
                # ('NoneType' object has no attribute 'hostname')"). Counted apart: the
                # operator's own processes (watchers) must never exit.
                (self.worker_exits if p in self.workers else self.crashes).append(
                    f"{p.name} exited with {code}")
                p.start(self.env(), self.work / "logs")

    # --- the end -----------------------------------------------------------------------------

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


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
    parser.add_argument("--work", type=Path, default=REPO / ".local" / "soak")
    parser.add_argument("--report", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)

    soak = Soak(args.minutes, args.seed, args.objects, args.namespaces, args.work, args.pool)
    print(f"soak: seed {args.seed}, {args.minutes:g} min, {args.objects} objects in "
          f"{args.namespaces} namespaces, {args.pool} workers; logs in {args.work}", flush=True)
    started = time.monotonic()
    soak.setup()
    soak.start_operator()
    try:
        soak.chaos(each_fault=args.each_fault)
        soak.supervise()
        os.environ.update({k: v for k, v in soak.env().items()
                           if k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL",
                                    "KUBECONFIG", "DEBUG")})
        from soak import check

        result = check.run(soak, settle=args.settle)
    finally:
        soak.stop()
        for ns in soak.ns:
            soak.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    result.update({"seed": args.seed, "minutes": args.minutes, "pool": args.pool,
                   "faults": soak.faults,
                   "changes": soak.changes, "seconds": round(time.monotonic() - started)})
    print(json.dumps(result, indent=2), flush=True)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
