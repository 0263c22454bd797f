"""Two reconcilers of one kind, end to end: a user's own ``FooLabeller`` (``tests/multiproject``)
beside the sample's ``FooReconciler``, on real watcher and worker processes and the real
api-server. Each converges its own child, each keeps its own ledger row, history, backoff and
metrics, one failing never holds the other up, and the watcher serves both from one stream
of the kind."""

from __future__ import annotations

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from reconcilers.models import ReconcileRecord, WatchStream, WorkItem
from tests.helpers import free_port, http_get, wait_for
from tests.e2e.test_engine import create, get
from tests.multiproject.markers import FAIL, FINALIZED, MAY_FINISH

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOO, LABELLER = "foos.samplecontroller.k8s.io", "foo-labeller"
GROUP, VERSION, PLURAL = "samplecontroller.k8s.io", "v1alpha1", "foos"
RESOURCE = f"{GROUP}/{VERSION}/{PLURAL}"
FINALIZING, JANITOR = "probes.finalizing.operator.local", "probe-janitor"
FGROUP = "finalizing.operator.local"


def _foo(name: str, annotations: dict | None = None) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Foo",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"deploymentName": f"{name}-web", "replicas": 1}}


def _or_none(read):
    try:
        return read()
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _item(reconciler: str, namespace: str, name: str) -> WorkItem:
    """The key's ledger row (an unsaved blank one until the watcher has made it)."""
    return (WorkItem.objects.filter(reconciler=reconciler, namespace=namespace, name=name).first()
            or WorkItem())


def _metrics(port: int) -> list:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.fixture
def no_finalizer_left(kube, namespace):
    """Whatever the test left held by a finalizer of its reconcilers loses it once their
    processes have stopped (so none adds it back; a test asks for this fixture before
    ``operator``, whose processes stop first): nothing else would take it off, the namespace
    would stay Terminating, and so would the kind's CRD when a later test deletes it."""
    yield
    crd = client.CustomObjectsApi(kube)
    for group, version, plural in ((GROUP, VERSION, PLURAL), (FGROUP, "v1", "probes")):
        try:
            held = crd.list_namespaced_custom_object(group, version, namespace, plural)["items"]
        except client.ApiException:
            continue
        for obj in held:
            if obj["metadata"].get("finalizers"):
                _or_none(lambda: crd.patch_namespaced_custom_object(
                    group, version, namespace, plural, obj["metadata"]["name"],
                    {"metadata": {"finalizers": None}}))


def test_a_second_reconciler_of_the_samples_kind_converges_beside_the_first(
        kube, no_finalizer_left, operator, redis_client):
    operator.env["DJANGO_SETTINGS_MODULE"] = "tests.multiproject.settings"
    watcher_port, worker_port = free_port(), free_port()
    operator.env["OPERATOR_WATCHER_HTTP_PORT"] = str(watcher_port)
    operator.start_watcher(FOO, LABELLER)
    operator.env["OPERATOR_WORKER_HTTP_PORT"] = str(worker_port)
    operator.start_worker(concurrency=2, pool="threads")
    ns = operator.namespace
    crd, apps, core = client.CustomObjectsApi(kube), client.AppsV1Api(kube), client.CoreV1Api(kube)

    crd.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _foo("stuck", {FAIL: "true"}))
    crd.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _foo("calm"))

    # The labeller fails "stuck" again and again, with backoff; meanwhile the sample converges
    # both Foos and the labeller converges "calm": neither reconciler holds the other up.
    wait_for(lambda: _item(LABELLER, ns, "stuck").attempts >= 3, 60,
             "the labeller to retry the failing Foo with backoff")
    for name in ("stuck", "calm"):
        wait_for(lambda: _or_none(lambda: apps.read_namespaced_deployment(f"{name}-web", ns)),
                 60, f"the sample's Deployment of {name}")
        wait_for(lambda: _item(FOO, ns, name).last_outcome == "success", 30,
                 f"the sample's run of {name} to succeed")
    labels = wait_for(lambda: _or_none(lambda: core.read_namespaced_config_map("calm-labels", ns)),
                      60, "the labeller's ConfigMap of the Foo it can reconcile")
    assert labels.data == {"foo": "calm", "deployment": "calm-web"}
    assert (labels.metadata.owner_references[0].kind, labels.metadata.owner_references[0].name) \
        == ("Foo", "calm")
    assert _or_none(lambda: core.read_namespaced_config_map("stuck-labels", ns)) is None

    # Each its own ledger row and history: the sample's key of "stuck" is at rest, no backoff,
    # while the labeller's is failing.
    sample_item, labeller_item = _item(FOO, ns, "stuck"), _item(LABELLER, ns, "stuck")
    assert sample_item.attempts == 0 and labeller_item.last_outcome == "error"
    assert "told to fail stuck" in labeller_item.last_error
    history = ReconcileRecord.objects.filter(namespace=ns, name="stuck")
    assert "success" in set(history.filter(reconciler=FOO).values_list("outcome", flat=True))
    assert set(history.filter(reconciler=LABELLER).values_list("outcome", flat=True)) \
        == {"error"}
    assert history.filter(reconciler=LABELLER).count() >= 3

    # Metrics carry the reconciler's own name.
    def counted() -> None:
        runs = {(s.labels["controller"], s.labels["result"]): s.value
                for s in _metrics(worker_port)
                if s.name == "controller_runtime_reconcile_total"}
        assert runs.get((LABELLER, "error"), 0) >= 3 and runs.get((FOO, "success"), 0) >= 2, runs
        assert runs.get((LABELLER, "success"), 0) >= 1, runs
    wait_for(lambda: counted() is None, 30, "the worker's counts by reconciler")

    # One stream of the kind serves both: listed once, with a status row per reconciler.
    relists = [s.value for s in _metrics(watcher_port) if s.name == "operator_relists_total"
               and s.labels["resource"] == RESOURCE and s.labels["namespace"] == ns]
    assert sum(relists) == 1, relists
    wait_for(lambda: set(WatchStream.objects.filter(resource=RESOURCE).values_list(
        "reconciler", "role")) == {(FOO, "primary"), (LABELLER, "primary")}, 30,
        "a stream status row of the kind for each reconciler")

    # The failure goes away: the labeller converges "stuck" too, and its backoff is forgotten.
    crd.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stuck",
                                       {"metadata": {"annotations": {FAIL: None}}})
    wait_for(lambda: _or_none(lambda: core.read_namespaced_config_map("stuck-labels", ns)), 60,
             "the labeller to converge the Foo once it may")
    wait_for(lambda: _item(LABELLER, ns, "stuck").attempts == 0, 30,
             "the labeller's backoff to be forgotten")

    # Its finalizer is its own: deleting the Foo runs the labeller's cleanup, then it goes.
    stuck = crd.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stuck")
    assert f"{PLURAL}.{GROUP}/{LABELLER}" in stuck["metadata"]["finalizers"]
    crd.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stuck")
    wait_for(lambda: _or_none(lambda: crd.get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "stuck")) is None, 60, "the Foo to go after its cleanup")
    assert f"{ns}/stuck".encode() in redis_client.lrange(FINALIZED, 0, -1)
    wait_for(lambda: ReconcileRecord.objects.filter(reconciler=FOO, namespace=ns, name="stuck",
                                                    outcome="gone").exists(), 30,
             "the sample's 'gone' run")




def _finalizers(kube, ns: str, name: str) -> list[str]:
    return ((get(kube, ns, name, FGROUP) or {"metadata": {}})["metadata"].get("finalizers")
            or [])


def test_each_reconciler_of_a_kind_holds_an_object_until_its_own_cleanup_is_done(
        kube, no_finalizer_left, operator, redis_client):
    operator.env["DJANGO_SETTINGS_MODULE"] = "tests.multiproject.settings"
    operator.start_watcher(FINALIZING, JANITOR)
    operator.start_worker(concurrency=2, pool="threads")
    ns = operator.namespace
    uid = create(kube, ns, "tidy", group=FGROUP, value=1)["metadata"]["uid"]
    own, janitors = f"probes.{FGROUP}/finalizer", f"probes.{FGROUP}/{JANITOR}"
    wait_for(lambda: sorted(_finalizers(kube, ns, "tidy")) == sorted([own, janitors]), 60,
             "each reconciler's finalizer on the object")

    client.CustomObjectsApi(kube).delete_namespaced_custom_object(FGROUP, "v1", ns, "probes",
                                                                  "tidy")
    # The kind's own cleanup runs and takes its own finalizer off, never the janitor's: the
    # object stays, held by the janitor, whose cleanup is not done.
    wait_for(lambda: _finalizers(kube, ns, "tidy") == [janitors], 60,
             "the kind's own cleanup to release its hold only")
    assert redis_client.get(f"probe:finalized:{uid}") == b"1"
    assert get(kube, ns, "tidy", FGROUP)["metadata"].get("deletionTimestamp")

    redis_client.set(f"{MAY_FINISH}{ns}/tidy", 1)
    wait_for(lambda: get(kube, ns, "tidy", FGROUP) is None, 60,
             "the object to go once every reconciler's cleanup is done")
    assert f"janitor:{ns}/tidy".encode() in redis_client.lrange(FINALIZED, 0, -1)
    assert redis_client.get(f"probe:finalized:{uid}") == b"1"  # the kind's cleanup ran once
