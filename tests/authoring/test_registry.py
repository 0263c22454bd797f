"""Several reconcilers of one kind: each under a name of its own, with its own finalizer, one
CRD, merged RBAC and one watch stream between them; a taken or malformed name is refused with
what to do about it."""

from __future__ import annotations

import re
import threading

import pytest

from reconcilers._authoring import rbac
from reconcilers._authoring.registry import AlreadyRegistered
from reconcilers._base.reconcile import Key
from reconcilers._watch.enqueuer import Enqueuer
from reconcilers._watch.handlers import PRIMARY
from reconcilers._watch.streams import build_streams
from reconcilers.api import Owns, Reconciler, ReconcilerRegistry


class PodLabeller(Reconciler):
    version, kind = "v1", "Pod"
    name = "pod-labeller"
    owns = [Owns("v1", "ConfigMap")]

    def finalize(self, obj, ctx):
        return None


class PodReaper(Reconciler):
    version, kind = "v1", "Pod"
    name = "pod-reaper"
    owns = [Owns("v1", "Secret")]

    def finalize(self, obj, ctx):
        return None


class Pods(Reconciler):
    """The kind's reconciler as before: no name of its own."""

    version, kind = "v1", "Pod"

    def finalize(self, obj, ctx):
        return None


def test_a_reconciler_is_named_after_its_resource_unless_it_declares_a_name():
    assert Pods.name() == "pods"
    assert PodLabeller.name() == "pod-labeller"
    assert PodLabeller.resource_name() == Pods.resource_name() == "pods"

    class Child(PodLabeller):
        pass

    assert Child.name() == "pod-labeller"  # inherited, as any attribute


def test_two_reconcilers_of_one_kind_register_side_by_side():
    registry = ReconcilerRegistry()
    for cls in (Pods, PodLabeller, PodReaper):
        registry.register(cls)
    assert registry.names() == ["pod-labeller", "pod-reaper", "pods"]
    assert registry.get_class("pod-reaper") is PodReaper
    assert str(Key("pod-labeller", "ns", "web")) == "pod-labeller:ns/web"
    assert Key.parse("pod-labeller:ns/web").reconciler == "pod-labeller"


def test_a_second_class_under_a_taken_name_is_refused_naming_both():
    class Copycat(Reconciler):
        version, kind = "v1", "Pod"
        name = "pod-labeller"

    registry = ReconcilerRegistry()
    registry.register(PodLabeller)
    with pytest.raises(AlreadyRegistered) as refused:
        registry.register(Copycat)
    message = str(refused.value)
    assert "PodLabeller" in message and "Copycat" in message and "'pod-labeller'" in message


def test_a_second_reconciler_of_a_kind_without_a_name_is_told_to_give_one():
    class AlsoPods(Reconciler):
        version, kind = "v1", "Pod"

    registry = ReconcilerRegistry()
    registry.register(Pods)
    with pytest.raises(AlreadyRegistered, match=r"Pods .*AlsoPods|AlsoPods .*Pods") as refused:
        registry.register(AlsoPods)
    assert 'set name = "..."' in str(refused.value)


@pytest.mark.parametrize("bad", ["", "Pod-Labeller", "team:labeller", "team/labeller",
                                 "labeller#2", "-labeller", "labeller-", "pod labeller",
                                 "x" * 64])
def test_a_name_that_cannot_be_part_of_a_key_is_refused_when_the_class_is_defined(bad):
    with pytest.raises(TypeError, match=re.escape(f"Bad.name = {bad!r} is not a valid")):
        class Bad(Reconciler):
            version, kind = "v1", "Pod"
            name = bad


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(TypeError, match="Bad.name must be a string"):
        class Bad(Reconciler):
            version, kind = "v1", "Pod"
            name = 7


def test_each_reconciler_of_a_kind_holds_objects_with_a_finalizer_of_its_own():
    assert Pods.finalizer_name() == "pods.core/finalizer"  # as objects already carry it
    assert PodLabeller.finalizer_name() == "pods.core/pod-labeller"
    assert PodReaper.finalizer_name() == "pods.core/pod-reaper"


def test_two_reconcilers_of_one_kind_declaring_one_finalizer_are_refused_naming_both():
    class Sharer(Reconciler):
        version, kind = "v1", "Pod"
        name = "pod-sharer"
        finalizer = "pods.core/pod-labeller"

        def finalize(self, obj, ctx):
            return None

    registry = ReconcilerRegistry()
    registry.register(PodLabeller)
    with pytest.raises(AlreadyRegistered, match="PodLabeller.*pods.core/pod-labeller") as refused:
        registry.register(Sharer)
    assert "Sharer" in str(refused.value)


def test_one_finalizer_declared_on_two_kinds_is_fine():
    class Cleaner(Reconciler):
        version, kind = "v1", "Service"
        finalizer = "pods.core/pod-labeller"  # no object is both a Pod and a Service

        def finalize(self, obj, ctx):
            return None

    registry = ReconcilerRegistry()
    registry.register(PodLabeller)
    registry.register(Cleaner)
    assert registry.names() == ["pod-labeller", "services"]


def test_the_rbac_of_two_reconcilers_of_one_kind_is_merged_not_repeated():
    rules = rbac.rules_for([PodLabeller, PodReaper])
    pods = [r for r in rules if any(res.startswith("pods") for res in r["resources"])]
    assert sum(res == "pods" for r in pods for res in r["resources"]) == 1
    assert {"get", "list", "watch", "patch"} <= set(
        next(r for r in pods if "pods" in r["resources"])["verbs"])
    children = [r for r in rules if set(r["resources"]) & {"configmaps", "secrets"}]
    assert any({"configmaps", "secrets"} <= set(r["resources"]) for r in children), children


def test_reconcilers_of_one_kind_share_one_stream_with_a_handler_each():
    stop = threading.Event()
    streams = build_streams([PodLabeller, PodReaper], Enqueuer(stop), stop)
    pod_streams = [s for s in streams if s.gvr.kind == "Pod"]
    assert len(pod_streams) == len({s.namespace for s in streams})  # one per namespace
    handlers = pod_streams[0].router.handlers
    assert [(h.reconciler, h.role) for h in handlers] == [(PodLabeller, PRIMARY),
                                                          (PodReaper, PRIMARY)]
    put: list[Key] = []
    pod_streams[0].router.put = lambda key, trigger: put.append(key)
    pod = {"metadata": {"name": "web", "namespace": "ns"}}
    pod_streams[0].router("added", None, pod)
    assert put == [Key("pod-labeller", "ns", "web"), Key("pod-reaper", "ns", "web")]


class ProbeAuditor(Reconciler):
    """A second reconciler of the test app's Probe kind (so its app, and its CRD file)."""

    name = "probe-auditor"
    group, version, kind = "test.operator.local", "v1", "Probe"


ProbeAuditor.__module__ = "tests.operatorapp.reconcilers"


def test_reconcilers_of_one_kind_share_its_crd_file_and_its_crd_rule(settings):
    from reconcilers._authoring import crds
    from tests.operatorapp.reconcilers import ProbeReconciler

    assert crds.manifest_for(ProbeAuditor) == crds.manifest_for(ProbeReconciler)
    assert crds.manifest_for(ProbeAuditor).name == "probes.test.operator.local.yaml"
    settings.RECONCILERS_APPLY_CRDS = True
    named = [r.get("resourceNames") for r in rbac.rules_for([ProbeReconciler, ProbeAuditor])
             if r["resources"] == ["customresourcedefinitions"] and "resourceNames" in r]
    assert named == [["probes.test.operator.local"]]


def test_the_crd_of_a_kind_is_applied_once_for_all_its_reconcilers(api, probe_crds, settings):
    import io

    from reconcilers._authoring import crds
    from tests.operatorapp.reconcilers import ProbeReconciler

    settings.RECONCILERS_APPLY_CRDS = True
    out = io.StringIO()
    crds.sync_registered([ProbeReconciler, ProbeAuditor], out=out)
    assert out.getvalue().splitlines() == ["CRD probes.test.operator.local: unchanged"]


def test_two_reconcilers_of_different_kinds_under_one_name_are_told_to_rename_one():
    class ServiceLabeller(Reconciler):
        version, kind = "v1", "Service"
        name = "pod-labeller"

    registry = ReconcilerRegistry()
    registry.register(PodLabeller)
    with pytest.raises(AlreadyRegistered, match="both named 'pod-labeller': rename one of them"):
        registry.register(ServiceLabeller)


def test_the_old_name_of_the_reconciler_registry_imports_with_a_deprecation_warning():
    """``reconcilers.api.Registry`` is ``ReconcilerRegistry`` for one release, named in a
    warning and not exported by ``import *``."""
    import reconcilers.api as api

    with pytest.warns(DeprecationWarning, match=r"reconcilers\.api\.ReconcilerRegistry"):
        from reconcilers.api import Registry as old
    assert old is api.ReconcilerRegistry
    assert "Registry" not in api.__all__
    with pytest.raises(AttributeError, match="Registri"):
        api.Registri
