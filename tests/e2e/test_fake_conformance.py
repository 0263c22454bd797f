"""The fake cluster against the api-server it stands in for: each scenario sends the same
requests, through the same ``kube.request``, to ``reconcilers.testing.FakeCluster`` and to the
local stack's kube-apiserver, and the two must answer alike - status codes and reasons,
whether a write changed the resourceVersion, generation, field ownership, finalizers, the
garbage collector's work, what a selector lists. What legitimately differs (uids, timestamps,
resourceVersion values, objects the control plane makes by itself) is left out of what is
compared. On the real cluster the garbage collector (kube-controller-manager) works a moment
later: a scenario waits for it there.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import yaml

from reconcilers._kube import kube
from reconcilers.testing import FakeCluster
from tests.helpers import REPO

pytestmark = pytest.mark.e2e

FOO_CRD = REPO / "reconcilers/contrib/samplecontroller/crds/foos.samplecontroller.k8s.io.yaml"
FOOS = "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/{ns}/foos"
CONFIGMAPS = "/api/v1/namespaces/{ns}/configmaps"
MERGE, JSON_PATCH = kube.MERGE_PATCH, "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class Target:
    """One side of the comparison: requests sent through ``kube.request``, answers noted as
    ``"ok"`` or ``(status, reason)``."""

    def __init__(self, api: Any, namespace: str, real: bool):
        self.api, self.ns, self.real = api, namespace, real

    def send(self, method: str, path: str, body: Any = None, **options: Any) -> tuple:
        try:
            return "ok", kube.request(self.api, method, path.format(ns=self.ns), body,
                                      **options)
        except kube.ApiError as e:
            return (e.status, e.reason), None

    def get(self, path: str) -> dict | None:
        return kube.get_or_none(self.api, path.format(ns=self.ns))

    def until(self, done: Callable[[], bool], timeout: float = 90) -> bool:
        """``done()`` once it holds: at once on the fake, the control plane's moment later on
        the real cluster."""
        deadline = time.monotonic() + (timeout if self.real else 0)
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


@pytest.fixture
def targets(api, namespace) -> list[Target]:
    from reconcilers._authoring import crds

    crds.apply_manifest(api, FOO_CRD)
    fake = FakeCluster([{"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": namespace}}],
                       crds=[yaml.safe_load(FOO_CRD.read_text())])
    return [Target(api, namespace, real=True), Target(fake, namespace, real=False)]


def _foo(name: str, replicas: int = 1, **meta: Any) -> dict:
    return {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": {"name": name, **meta},
            "spec": {"deploymentName": name, "replicas": replicas}}


def _configmap(name: str, **meta: Any) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta},
            "data": {"k": "v"}}


def _alike(targets: list[Target], scenario: Callable[[Target], list]) -> list:
    real, fake = (scenario(t) for t in targets)
    assert fake == real
    return real


def _rv(obj: dict | None) -> str | None:
    return (obj or {}).get("metadata", {}).get("resourceVersion")


def test_writes_answer_with_the_same_codes_versions_and_generations(targets):
    def scenario(t: Target) -> list:
        seen = []
        one = FOOS + "/one"
        outcome, made = t.send("POST", FOOS, {**_foo("one"), "status": {"availableReplicas": 9}})
        seen += [outcome, made["metadata"]["generation"], made.get("status")]
        seen.append(t.send("POST", FOOS, _foo("one"))[0])  # AlreadyExists
        seen.append(t.send("GET", FOOS + "/missing")[0])  # NotFound
        seen.append(t.send("PUT", FOOS + "/missing", _foo("missing"))[0])
        seen.append(t.send("POST", "/api/v1/namespaces/no-such-namespace/configmaps",
                           _configmap("lost"))[0])
        outcome, named = t.send("POST", CONFIGMAPS, {**_configmap(""), "metadata": {
            "generateName": "made-"}})
        seen += [outcome, named["metadata"]["name"].startswith("made-"),
                 len(named["metadata"]["name"]) > len("made-")]
        seen.append(t.send("POST", CONFIGMAPS, {**_configmap(""), "metadata": {}})[0])
        _, deployment = t.send("POST", "/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "web"}]}}},
            "status": {"availableReplicas": 5}})
        seen += [deployment["metadata"]["generation"], deployment["status"]]
        seen.append(t.send("DELETE", "/apis/apps/v1/namespaces/{ns}/deployments/web")[1]["kind"])

        def write(method: str, body: Any, path: str = one, **options: Any) -> tuple:
            before = t.get(one)
            outcome, _ = t.send(method, path, body, **options)
            after = t.get(one)
            return (outcome, _rv(after) != _rv(before),
                    after["metadata"]["generation"] - before["metadata"]["generation"])

        seen.append(write("PATCH", {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE))
        seen.append(write("PATCH", {"spec": {"replicas": 2}}, content_type=MERGE))
        seen.append(write("PATCH", {"spec": {"replicas": 2}}, content_type=MERGE))  # no change
        seen.append(write("PATCH", {"status": {"availableReplicas": 3}}, one + "/status",
                          content_type=MERGE))
        seen.append(write("PATCH", {"status": {"availableReplicas": 7}}, content_type=MERGE))
        seen.append(t.get(one)["status"])
        seen.append(write("PATCH", {"spec": {"replicas": 4}}, one + "/status",
                          content_type=MERGE))
        stale = {**t.get(one), "spec": {"deploymentName": "one", "replicas": 5}}
        seen.append(write("PATCH", {"metadata": {"resourceVersion": "1"},
                                    "spec": {"replicas": 6}}, content_type=MERGE))
        seen.append(write("PUT", {**stale, "metadata": {**stale["metadata"],
                                                        "resourceVersion": "1"}}))
        seen.append(write("PUT", stale))
        seen.append(write("PATCH", [{"op": "replace", "path": "/spec/replicas", "value": 8}],
                          content_type=JSON_PATCH))
        seen.append(write("PATCH", [{"op": "test", "path": "/spec/replicas", "value": 1}],
                          content_type=JSON_PATCH))
        seen.append(write("PATCH", {"spec": {"replicas": 9}}, content_type=STRATEGIC))
        seen.append(t.get(one)["spec"])
        seen.append(t.send("DELETE", one, {"preconditions": {"uid": "not-its-uid"}})[0])
        seen.append(t.send("DELETE", one, {"preconditions": {"resourceVersion": "1"}})[0])
        seen.append(t.send("DELETE", one)[0])
        seen.append(t.get(one))
        return seen

    seen = _alike(targets, scenario)
    assert seen[3] == (409, "AlreadyExists") and seen[4] == (404, "NotFound")


def test_server_side_apply_owns_fields_conflicts_and_forces(targets):
    def managers(t: Target) -> dict:
        return {m["manager"]: sorted(m["fieldsV1"].get("f:spec", {}))
                for m in t.get(FOOS + "/ssa")["metadata"].get("managedFields") or []
                if m["operation"] == "Apply"}

    def scenario(t: Target) -> list:
        def apply(manager: str, replicas: int, force: bool = False, **meta: Any) -> Any:
            """The answer, and whether the object's resourceVersion changed."""
            query = {"fieldManager": manager, **({"force": "true"} if force else {})}
            before = _rv(t.get(FOOS + "/ssa"))
            outcome = t.send("PATCH", FOOS + "/ssa", _foo("ssa", replicas, **meta),
                             query=query, content_type=kube.APPLY_PATCH)[0]
            return outcome, _rv(t.get(FOOS + "/ssa")) != before

        seen = [apply("alpha", 2, labels={"by": "alpha"}), managers(t)]
        seen.append(apply("beta", 3))  # conflict on spec.replicas
        seen.append(apply("beta", 2))  # the same value: shared, no conflict
        seen.append(managers(t))
        seen.append(apply("beta", 3, force=True))
        seen += [managers(t), t.get(FOOS + "/ssa")["spec"]["replicas"]]
        seen.append(apply("alpha", 2))  # beta owns replicas now: a conflict again
        seen.append(apply("alpha", 3))  # beta's value: shared; and alpha drops its label
        foo = t.get(FOOS + "/ssa")
        seen += [foo["spec"]["replicas"], (foo["metadata"].get("labels") or {}), managers(t)]
        rv = _rv(foo)
        seen.append(apply("alpha", 4, force=True))  # unchanged rv otherwise: nothing else did
        seen.append(apply("alpha", 4, resourceVersion=rv))  # stale now
        seen.append(t.send("PATCH", FOOS + "/ssa", _foo("ssa", 1),
                           content_type=kube.APPLY_PATCH)[0])  # no fieldManager
        seen.append(apply("alpha", 4))  # the same again: nothing changes
        return seen

    seen = _alike(targets, scenario)
    assert seen[2] == ((409, "Conflict"), False) and seen[11] == {}
    assert seen[-1] == ("ok", False)


def test_a_delete_waits_for_the_finalizers(targets):
    def scenario(t: Target) -> list:
        path = FOOS + "/held"
        seen = [t.send("POST", FOOS, _foo("held", finalizers=["test.local/hold"]))[0]]
        before = t.get(path)
        seen.append(t.send("DELETE", path)[0])
        held = t.get(path)
        seen += [bool(held["metadata"].get("deletionTimestamp")), _rv(held) != _rv(before)]
        seen.append(t.send("PATCH", path, {"metadata": {"finalizers": [
            "test.local/hold", "test.local/another"]}}, content_type=MERGE)[0])
        seen.append(t.send("PATCH", path, {"spec": {"replicas": 3}}, content_type=MERGE)[0])
        seen.append(t.send("PATCH", path, {"metadata": {"finalizers": None}},
                           content_type=MERGE)[0])
        seen.append(t.until(lambda: t.get(path) is None, timeout=30))
        return seen

    seen = _alike(targets, scenario)
    assert seen[4] == (422, "Invalid")


def test_the_garbage_collector_deletes_orphans_and_drops_dangling_references(targets):
    def scenario(t: Target) -> list:
        _, owner = t.send("POST", CONFIGMAPS, _configmap("owner"))
        _, other = t.send("POST", CONFIGMAPS, _configmap("other"))

        def ref(obj: dict) -> dict:
            return {"apiVersion": "v1", "kind": "ConfigMap", "name": obj["metadata"]["name"],
                    "uid": obj["metadata"]["uid"]}

        t.send("POST", CONFIGMAPS, _configmap("only-child", ownerReferences=[ref(owner)]))
        t.send("POST", CONFIGMAPS, _configmap("held-child", ownerReferences=[ref(owner)],
                                              finalizers=["test.local/hold"]))
        t.send("POST", CONFIGMAPS, _configmap("two-owners",
                                              ownerReferences=[ref(owner), ref(other)]))
        seen = [t.send("DELETE", CONFIGMAPS + "/owner")[0]]
        seen.append(t.until(lambda: t.get(CONFIGMAPS + "/only-child") is None))
        seen.append(t.until(lambda: bool(t.get(CONFIGMAPS + "/held-child")["metadata"].get(
            "deletionTimestamp"))))
        seen.append(t.until(lambda: [r["name"] for r in t.get(CONFIGMAPS + "/two-owners")[
            "metadata"]["ownerReferences"]] == ["other"]))
        t.send("PATCH", CONFIGMAPS + "/held-child", {"metadata": {"finalizers": None}},
               content_type=MERGE)
        seen.append(t.until(lambda: t.get(CONFIGMAPS + "/held-child") is None))
        return seen

    assert _alike(targets, scenario) == ["ok", True, True, True, True]


def test_lists_filter_by_label_and_field_selectors(targets):
    selectors = [{"labelSelector": "app=web"}, {"labelSelector": "app!=web"},
                 {"labelSelector": "app in (web,db)"}, {"labelSelector": "app notin (web)"},
                 {"labelSelector": "tier"}, {"labelSelector": "!tier"},
                 {"labelSelector": "app=web,tier=front"},
                 {"fieldSelector": "metadata.name=cache"},
                 {"fieldSelector": "metadata.name!=cache"},
                 {"fieldSelector": "spec.nothing=x"}]

    def scenario(t: Target) -> list:
        for name, labels in (("web", {"app": "web", "tier": "front"}), ("db", {"app": "db"}),
                             ("cache", {"tier": "back"}), ("plain", {})):
            t.send("POST", CONFIGMAPS, _configmap(name, labels=labels))
        seen = []
        for query in selectors:
            outcome, listed = t.send("GET", CONFIGMAPS, query=query)
            # The control plane puts its CA bundle in every namespace by itself.
            seen.append(sorted(o["metadata"]["name"] for o in listed["items"]
                               if o["metadata"]["name"] != "kube-root-ca.crt")
                        if outcome == "ok" else outcome)
        return seen

    seen = _alike(targets, scenario)
    assert seen[0] == ["web"] and seen[-1] == (400, "BadRequest")


def test_events_are_written_through_either_api(targets):
    def scenario(t: Target) -> list:
        _, foo = t.send("POST", FOOS, _foo("noted"))
        about = {"apiVersion": foo["apiVersion"], "kind": "Foo", "name": "noted",
                 "namespace": t.ns, "uid": foo["metadata"]["uid"]}
        new = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": "noted.1", "namespace": t.ns}, "regarding": about,
               "type": "Normal", "reason": "Synced", "note": "fine", "action": "Reconcile",
               "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "test",
               "reportingInstance": "test-1"}
        old = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "noted.2"},
               "involvedObject": about, "type": "Warning", "reason": "Broken",
               "message": "not fine"}
        seen = [t.send("POST", "/apis/events.k8s.io/v1/namespaces/{ns}/events", new)[0],
                t.send("POST", "/apis/events.k8s.io/v1/namespaces/{ns}/events", new)[0],
                t.send("POST", "/api/v1/namespaces/{ns}/events", old)[0]]
        seen.append(t.send("PATCH", "/apis/events.k8s.io/v1/namespaces/{ns}/events/noted.1",
                           {"series": {"count": 2,
                                       "lastObservedTime": "2026-01-01T00:00:01.000000Z"}},
                           content_type=MERGE)[0])
        got = t.get("/apis/events.k8s.io/v1/namespaces/{ns}/events/noted.1")
        seen.append((got["reason"], got["note"], got["series"]["count"]))
        return seen

    assert _alike(targets, scenario)[1] == (409, "AlreadyExists")
