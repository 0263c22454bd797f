"""The workload every implementation gets: BenchItem CRD, namespaces, creates, updates, checks.

One place builds every request the harness sends, so no implementation gets a friendlier
workload than another. The correctness check is here too: every object must end with
``status.observedGeneration == metadata.generation`` and ``status.value == spec.value`` (and
the value the harness last wrote); an implementation that fails it gets no throughput figure.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import yaml

from .config import BENCH
from .kube import MERGE_PATCH, ApiError, Kube

GROUP, VERSION, PLURAL, KIND = "bench.operator.local", "v1", "benchitems", "BenchItem"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = BENCH / "benchapp" / "crds" / f"{CRD_NAME}.yaml"
RUN_LABEL = "bench.operator.local/run"
OWNER_LABEL = "bench.operator.local/owner"  # which scratch dir's harness made it
STAMP_ANNOTATION = "bench.operator.local/stamp"
CANARY = "canary"


def path(namespace: str | None = None, name: str | None = None, status: bool = False) -> str:
    base = f"/apis/{GROUP}/{VERSION}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{PLURAL}"
    if name:
        base += f"/{name}"
    return base + ("/status" if status else "")


def ensure_crd(kube: Kube, timeout: float = 60) -> None:
    """Server-side apply the BenchItem CRD and wait until it is Established and its storage
    serves: a CRD just established answers 429 "storage is (re)initializing" for a moment."""
    body = yaml.safe_load(CRD_FILE.read_text())
    kube.request("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}",
                 body, query={"fieldManager": "django-crd-operator-bench", "force": "true"},
                 content_type="application/apply-patch+yaml")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True" and _serving(kube):
            return
        time.sleep(0.2)
    raise RuntimeError(f"CRD {CRD_NAME} not Established after {timeout}s")


def _serving(kube: Kube) -> bool:
    try:
        kube.get(path(), limit=1)
        return True
    except ApiError as e:
        if e.status != 429:
            raise
        return False


@dataclass
class Namespaces:
    """The namespaces of one measured run, labelled so a crashed run's leftovers are found."""

    run_id: str
    names: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, kube: Kube, tag: str, count: int = 1, owner: str = "") -> "Namespaces":
        run_id = f"{tag}-{uuid.uuid4().hex[:6]}"
        out = cls(run_id)
        for i in range(max(1, count)):
            name = f"bench-{run_id}-{i}"
            kube.request("POST", "/api/v1/namespaces", {"metadata": {
                "name": name, "labels": {RUN_LABEL: run_id, OWNER_LABEL: owner}}})
            out.names.append(name)
        return out

    def of(self, i: int) -> str:
        """Objects are spread round-robin over the namespaces (as apiload does)."""
        return self.names[i % len(self.names)]

    def delete(self, kube: Kube) -> None:
        delete_namespaces(kube, self.names)


def delete_namespaces(kube: Kube, names: list[str], timeout: float = 300) -> None:
    """Delete the objects first (one DELETE collection per namespace, done synchronously by the
    api-server), then the namespaces: the namespace controller then has nothing left to do
    that could bleed into the next measurement."""
    for ns in names:
        try:
            kube.request("DELETE", path(ns), timeout=timeout)
        except ApiError as e:
            if e.status != 404:
                raise
    for ns in names:
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        except ApiError as e:
            if e.status != 404:
                raise


def owner_of(work_dir) -> str:
    """A label value naming one scratch dir: runs with other scratch dirs (the smoke test's)
    never touch this one's namespaces."""
    import hashlib

    return hashlib.sha256(str(work_dir).encode()).hexdigest()[:16]


def cleanup_stale(kube: Kube, owner: str) -> list[str]:
    """Namespaces a previous (crashed) run of this harness left behind; deleted with their
    objects."""
    body = kube.get("/api/v1/namespaces", labelSelector=f"{RUN_LABEL},{OWNER_LABEL}={owner}")
    names = [ns["metadata"]["name"] for ns in body.get("items", [])
             if not ns["metadata"].get("deletionTimestamp")]
    if names:
        delete_namespaces(kube, names)
    return names


def foreign_items(kube: Kube) -> dict[str, int]:
    """BenchItems in namespaces no bench run made, by namespace. Every implementation watches
    all namespaces, so these would be listed and reconciled inside the measurements (the
    restarted operator's first seconds), whichever run they happen to land in."""
    ours = {ns["metadata"]["name"] for ns in
            kube.get("/api/v1/namespaces", labelSelector=RUN_LABEL).get("items", [])}
    counts: dict[str, int] = {}
    for obj in kube.get(path()).get("items", []):
        namespace = obj["metadata"]["namespace"]
        if namespace not in ours:
            counts[namespace] = counts.get(namespace, 0) + 1
    return counts


def item(namespace: str, name: str, value: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": {"value": value}}


def create(kube: Kube, namespace: str, name: str, value: int) -> dict:
    return kube.request("POST", path(namespace), item(namespace, name, value))


def update(kube: Kube, namespace: str, name: str, value: int) -> tuple[float, int]:
    """Change spec.value (a new generation), stamped with the client's clock; returns
    (stamp, generation the api-server gave the change)."""
    stamp = time.time()
    body = {"metadata": {"annotations": {STAMP_ANNOTATION: f"{stamp:.6f}"}},
            "spec": {"value": value}}
    out = kube.request("PATCH", path(namespace, name), body, content_type=MERGE_PATCH)
    return stamp, int(out["metadata"]["generation"])


def converged(obj: dict) -> bool:
    status = obj.get("status") or {}
    return (status.get("observedGeneration") == obj["metadata"].get("generation")
            and status.get("value") == (obj.get("spec") or {}).get("value"))


@dataclass
class Check:
    """The correctness check's verdict, from a fresh LIST (not from any watch)."""

    ok: bool
    objects: int
    expected: int
    wrong: list[dict]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "objects": self.objects, "expected": self.expected,
                "wrong": self.wrong[:10], "wrong_count": len(self.wrong)}


def check(kube: Kube, namespaces: list[str], expected: dict[tuple[str, str], int]) -> Check:
    """Every expected object exists, is converged, and has the value the harness last wrote."""
    seen: dict[tuple[str, str], dict] = {}
    for ns in namespaces:
        token = ""
        while True:
            query = {"limit": "500", **({"continue": token} if token else {})}
            body = kube.get(path(ns), **query)
            for obj in body.get("items", []):
                seen[(ns, obj["metadata"]["name"])] = obj
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                break
    wrong = []
    for (ns, name), value in expected.items():
        obj = seen.get((ns, name))
        if obj is None:
            wrong.append({"object": f"{ns}/{name}", "problem": "missing"})
        elif not converged(obj) or obj["spec"].get("value") != value:
            wrong.append({"object": f"{ns}/{name}", "generation": obj["metadata"].get("generation"),
                          "status": obj.get("status"), "spec": obj.get("spec"),
                          "expected_value": value})
    return Check(ok=not wrong, objects=len(seen), expected=len(expected), wrong=wrong)


def describe_item() -> dict:
    """Size of a typical stored object, for the record."""
    sample = item("bench-x-0", "item-0", 1)
    return {"kind": f"{KIND}.{GROUP}", "create_body_bytes": len(json.dumps(sample))}
