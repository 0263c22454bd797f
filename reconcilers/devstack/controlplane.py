"""etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK on 127.0.0.1.

Authentication is real: a static token for ``admin`` in ``system:masters`` and RBAC
authorization, so least-privilege tests can run as ServiceAccounts (TokenRequest works because
the service-account signing key is configured). The controller manager runs its default
controllers (deployments, replica sets, garbage collection, namespaces, service accounts, ...),
the scheduler places Pods, and KWOK runs ``NODES`` simulated nodes that make Pods on them
Running and Ready without containers - so a Deployment's ``availableReplicas`` follows its
``replicas`` as in a cluster.
"""

from __future__ import annotations

import json
import secrets
import ssl
import subprocess
import urllib.request
from pathlib import Path

from .config import HERE, StackConfig
from .process import StartError, port_open, read_pid, spawn, stop, wait_until

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.1.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
NODES = 2
NODE_ANNOTATION = "kwok.x-k8s.io/node"

# Writes to the resources the soak judges, at Metadata level (who, what, when, the answer's
# code): the soak's checker reads them back to see, from outside the operator, whether two
# runs ever wrote one object at once (each run names itself in its User-Agent). Everything
# else is not logged; RequestReceived is omitted (ResponseComplete carries both timestamps).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete",
                                        "deletecollection"],
         "resources": [{"group": "", "resources": ["configmaps"]},
                       {"group": "soak.operator.local",
                        "resources": ["soakitems", "soakitems/status"]}]},
        {"level": "None"},
    ],
}


def build_binaries() -> Path:
    """Build (or find cached) binaries; returns their directory."""
    out = subprocess.run(
        ["bash", str(HERE / "build-control-plane.sh")],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ensure_pki(cfg: StackConfig) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost, a service-account key, a token."""
    pki = cfg.pki_dir
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                 "-subj", "/CN=django-crd-operator-local-ca",
                 "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))
    if not (pki / "apiserver.crt").exists():
        ext = pki / "apiserver.ext"
        ext.write_text(
            "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                 "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"))
        _openssl("x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
                 "-extfile", str(ext), "-out", str(pki / "apiserver.crt"))
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    if not (pki / "tokens.csv").exists():
        token = secrets.token_hex(24)
        (pki / "admin.token").write_text(token)
        (pki / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')


def write_kubeconfig(cfg: StackConfig) -> None:
    """A kubeconfig both kubectl and the official Python client accept (JSON is valid YAML)."""
    token = (cfg.pki_dir / "admin.token").read_text().strip()
    server = f"https://127.0.0.1:{cfg.apiserver_port}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": server, "certificate-authority": str(cfg.pki_dir / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    cfg.kubeconfig.write_text(json.dumps(doc, indent=2) + "\n")
    cfg.kubeconfig.chmod(0o600)


def _call(cfg: StackConfig, method: str, path: str,
          body: dict | None = None) -> tuple[int, bytes]:
    """One request to the api-server as ``admin`` (standard library only)."""
    ctx = ssl.create_default_context(cafile=str(cfg.pki_dir / "ca.crt"))
    token = (cfg.pki_dir / "admin.token").read_text().strip()
    req = urllib.request.Request(
        f"https://127.0.0.1:{cfg.apiserver_port}{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _get(cfg: StackConfig, path: str) -> tuple[int, bytes]:
    return _call(cfg, "GET", path)


def _post(cfg: StackConfig, path: str, body: dict) -> tuple[int, bytes]:
    return _call(cfg, "POST", path, body)


def ready(cfg: StackConfig) -> bool:
    """``/readyz`` answers ok and the ``default`` namespace exists."""
    try:
        return (_get(cfg, "/readyz")[0] == 200
                and _get(cfg, "/api/v1/namespaces/default")[0] == 200)
    except (OSError, FileNotFoundError):
        return False


def audit_flags(cfg: StackConfig) -> list[str]:
    """The api-server's audit log: the policy above, JSON lines, rotated (blocking mode, the
    log backend's default: an event is written before its response is sent)."""
    policy = cfg.state_dir / "audit-policy.json"  # JSON is valid YAML
    policy.write_text(json.dumps(AUDIT_POLICY, indent=2) + "\n")
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    return ["--audit-policy-file", str(policy), "--audit-log-path", str(cfg.audit_log),
            "--audit-log-format", "json", "--audit-log-maxsize", "200",
            "--audit-log-maxbackup", "5", "--audit-log-maxage", "7"]


def audit_enabled(cfg: StackConfig) -> bool:
    """Whether the running api-server was started with the audit log (a stack started before
    the flags existed has none until it is restarted)."""
    pid = read_pid(cfg.run_dir / "kube-apiserver.pid")
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
    except OSError:
        return False
    return b"--audit-log-path" in argv


def start(cfg: StackConfig) -> None:
    bins = build_binaries()
    ensure_pki(cfg)
    write_kubeconfig(cfg)
    pki = cfg.pki_dir
    run, logs = cfg.run_dir, cfg.log_dir

    if read_pid(run / "etcd.pid") is None:
        _port_free(cfg.etcd_port, "OPERATOR_ETCD_PORT")
        data = cfg.state_dir / "etcd"
        pid = spawn("etcd", [
            str(bins / "etcd"), "--data-dir", str(data), "--name", "local",
            "--listen-client-urls", f"http://127.0.0.1:{cfg.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{cfg.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{cfg.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{cfg.etcd_peer_port}",
            "--initial-cluster", f"local=http://127.0.0.1:{cfg.etcd_peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], run, logs)
        wait_until("etcd", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{cfg.etcd_port}/health", timeout=2).status == 200,
            60, logs / "etcd.log", pid)

    if read_pid(run / "kube-apiserver.pid") is None:
        _port_free(cfg.apiserver_port, "OPERATOR_APISERVER_PORT")
        pid = spawn("kube-apiserver", [
            str(bins / "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{cfg.etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(cfg.apiserver_port),
            "--cert-dir", str(pki),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "RBAC",
            "--service-account-issuer", ISSUER,
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--disable-admission-plugins", "ServiceAccount",
            "--endpoint-reconciler-type", "none",
            "--allow-privileged=true",
            *audit_flags(cfg),
            "--v", "1",
        ], run, logs)
        wait_until("kube-apiserver", lambda: ready(cfg), 180, logs / "kube-apiserver.log", pid)

    if read_pid(run / "kube-controller-manager.pid") is None:
        spawn("kube-controller-manager", [
            str(bins / "kube-controller-manager"),
            "--kubeconfig", str(cfg.kubeconfig),
            "--controllers", "*",  # the defaults a cluster runs
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--cluster-signing-cert-file", str(pki / "ca.crt"),
            "--cluster-signing-key-file", str(pki / "ca.key"),
            "--leader-elect=false",
            "--bind-address", "127.0.0.1",
            "--secure-port", "0",
            "--concurrent-gc-syncs", "5",
            "--v", "1",
        ], run, logs)
    if read_pid(run / "kube-scheduler.pid") is None:
        spawn("kube-scheduler", [
            str(bins / "kube-scheduler"),
            "--kubeconfig", str(cfg.kubeconfig),
            "--leader-elect=false",
            "--bind-address", "127.0.0.1",
            "--secure-port", "0",
            "--v", "1",
        ], run, logs)
    if read_pid(run / "kwok.pid") is None:
        spawn("kwok", [
            str(bins / "kwok"),
            "--kubeconfig", str(cfg.kubeconfig),
            "--config", str(bins / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", f"{NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds", "40",
            "--cidr", POD_CIDR,
            "--node-ip", "127.0.0.1",
            "--node-port", "0",
            "--v", "WARN",  # at INFO it logs every Pod and Node status it writes
        ], run, logs)
    wait_until("kube-apiserver", lambda: ready(cfg), 180, logs / "kube-apiserver.log")
    ensure_nodes(cfg)


def ensure_nodes(cfg: StackConfig) -> None:
    """The simulated nodes KWOK keeps Ready (created once; they live in etcd)."""
    for i in range(NODES):
        name = f"kwok-node-{i}"
        if _get(cfg, f"/api/v1/nodes/{name}")[0] == 200:
            continue
        status, body = _post(cfg, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {NODE_ANNOTATION: "fake"},
                         "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                    "kubernetes.io/os": "linux"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}},
        })
        if status not in (201, 409):
            raise StartError(f"could not create node {name}: {status} {body[:300]!r}")


def _port_free(port: int, variable: str) -> None:
    """Fail clearly when another process (say, a stack of another checkout) holds our port."""
    if port_open(port):
        raise StartError(
            f"127.0.0.1:{port} is in use by a process this checkout did not start "
            f"(another checkout's stack?): stop it (`make down` there) or set {variable}")


def stop_all(cfg: StackConfig) -> list[str]:
    stopped = []
    for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        if stop(name, cfg.run_dir):
            stopped.append(name)
    return stopped


def binary_dir() -> Path:
    return build_binaries()
