"""Where the local stack keeps its state and which loopback ports it uses."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _default_state_dir() -> Path:
    """``.local/`` of this repository's checkout when run from one; else of the current
    directory (a project that pip-installed the app keeps its stack beside its manage.py)."""
    checkout = HERE.parent.parent
    if (checkout / "operator_project").is_dir() and (checkout / "reconcilers").is_dir():
        return checkout / ".local"
    return Path.cwd() / ".local"


def _port(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class StackConfig:
    state_dir: Path
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    postgres_port: int
    redis_port: int
    db_name: str = "operator"
    db_user: str = "operator"
    db_password: str = "operator"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def audit_log(self) -> Path:
        """The api-server's audit log (JSON lines; ``controlplane.AUDIT_POLICY``)."""
        return self.log_dir / "kube-apiserver-audit.log"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env"

    @property
    def database_url(self) -> str:
        return (
            f"postgres://{self.db_user}:{self.db_password}"
            f"@127.0.0.1:{self.postgres_port}/{self.db_name}"
        )

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"


def load() -> StackConfig:
    """Ports are unusual on purpose, so the stack never collides with a system service."""
    return StackConfig(
        state_dir=Path(os.environ.get("OPERATOR_STATE_DIR") or _default_state_dir()).resolve(),
        etcd_port=_port("OPERATOR_ETCD_PORT", 12379),
        etcd_peer_port=_port("OPERATOR_ETCD_PEER_PORT", 12380),
        apiserver_port=_port("OPERATOR_APISERVER_PORT", 16443),
        postgres_port=_port("OPERATOR_POSTGRES_PORT", 15432),
        redis_port=_port("OPERATOR_REDIS_PORT", 16379),
    )
