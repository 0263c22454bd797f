"""The dependents' graph and one workflow run, without a cluster: the order, the refusals at
class definition, and what a run applies, waits for and deletes (``ctx`` replaced by a
recorder that keeps children in a dict)."""

from __future__ import annotations

import pytest

from reconcilers._authoring.dependents import workflow
from reconcilers.api import Dependent, Owns, Reconciler, Result, Workflow
from reconcilers._authoring.dependents import (ABSENT, DELETING, LABEL, PENDING, READY, WAITING,
                                               order)


def cm(name: str):
    return lambda obj: {"metadata": {"name": f"{obj['metadata']['name']}-{name}"}}


def dep(name: str, *depends_on: str, **kwargs) -> Dependent:
    return Dependent(name, "v1", "ConfigMap", desired=cm(name), depends_on=depends_on, **kwargs)


# --- the graph -------------------------------------------------------------------------------

def test_order_puts_each_dependent_after_what_it_depends_on_keeping_declaration_order():
    deps = [dep("service", "server"), dep("server", "config", "secret"), dep("config"),
            dep("secret"), dep("extra")]
    assert [d.name for d in order(deps)] == ["config", "secret", "extra", "server", "service"]


def test_a_cycle_is_refused_when_the_class_is_defined_and_named():
    with pytest.raises(ValueError, match=r"cycle: a -> c -> b -> a \(each depends on the next"):
        class Cyclic(Reconciler):  # noqa: F841
            version, kind = "v1", "Thing"
            dependents = Workflow(dep("a", "c"), dep("b", "a"), dep("c", "b"))


def test_a_dependent_on_itself_is_a_cycle():
    with pytest.raises(ValueError, match="cycle: a -> a"):
        Workflow(dep("a", "a"))


def test_an_unknown_name_in_depends_on_is_refused():
    with pytest.raises(ValueError, match="depends on 'db', which is not declared"):
        Workflow(dep("server", "db"))


def test_a_name_declared_twice_is_refused():
    with pytest.raises(ValueError, match="two dependents are named 'a'"):
        Workflow(dep("a"), dep("a"))


def test_a_name_that_is_not_a_label_value_is_refused():
    with pytest.raises(ValueError, match="DNS label"):
        dep("Web Server")


def test_the_workflow_owns_its_kinds_so_their_changes_reconcile_the_owner():
    class Site(Reconciler):
        version, kind = "v1", "Site"
        owns = [Owns("v1", "ConfigMap")]
        dependents = Workflow(dep("config"), Dependent(
            "server", "apps/v1", "Deployment", desired=cm("x"), depends_on=["config"]))

    assert [(o.api_version, o.kind) for o in Site.owns] == [
        ("v1", "ConfigMap"), ("apps/v1", "Deployment")]
    assert ("apps/v1", "Deployment") in Site.watched()
    assert Reconciler.owns == ()


def test_condition_types_are_the_camel_cased_name():
    assert dep("web-server").condition == "WebServerReady"


def test_a_name_whose_condition_is_the_summary_is_refused():
    with pytest.raises(ValueError, match="DependentsReady"):
        Workflow(dep("dependents"))


# --- one run, against a recorder ----------------------------------------------------------------

OWNER_UID = "uid-1"


@pytest.fixture(autouse=True)
def api_server_reads(monkeypatch):
    """The workflow's reads from the api-server answered by the recorder (``fresh``)."""
    reads: list[str] = []

    def list_fresh(ctx, api_version, kind, plural):
        reads.append(kind)
        return [dict(c) for c in ctx.children.values() if c["kind"] == kind]

    monkeypatch.setattr(workflow, "_list_fresh", list_fresh)
    return reads


class Recorder:
    """The part of ``ctx`` a workflow uses, over a dict of children (the api-server's truth;
    ``unseen`` names the ones the cache does not show yet)."""

    def __init__(self, children: dict[str, dict] | None = None):
        self.obj = {"metadata": {"name": "site", "namespace": "ns", "uid": OWNER_UID,
                                 "generation": 1, "resourceVersion": "1"}}
        self.children = children if children is not None else {}
        self.unseen: set[str] = set()
        self.writes: list[tuple[str, str]] = []
        self.conditions: dict[str, tuple[str, str]] = {}
        self.status_patches = 0

    def list(self, api_version, kind, plural=None):
        return [dict(c) for n, c in self.children.items()
                if c["kind"] == kind and n not in self.unseen]

    def apply(self, body, plural=None, force=False):
        name = body["metadata"]["name"]
        old = self.children.get(name, {})
        child = {**old, **body, "metadata": {
            **body["metadata"], "ownerReferences": [{"controller": True, "uid": OWNER_UID}],
            "deletionTimestamp": (old.get("metadata") or {}).get("deletionTimestamp")}}
        child.setdefault("data", {})
        child["data"] = {**(old.get("data") or {}), **(body.get("data") or {})}
        self.children[name] = child
        self.writes.append(("apply", name))
        return child

    def delete(self, api_version, kind, name, namespace=None, plural=None):
        self.writes.append(("delete", name))
        self.children[name]["metadata"]["deletionTimestamp"] = "now"
        return True

    def set_condition(self, type_, status, reason, message=""):
        self.conditions[type_] = ("True" if status is True else "False", reason)

    def patch_status(self, status=None, observed_generation=True):
        self.status_patches += 1

    def gone(self, name: str) -> None:
        """What the watch shows once the api-server deleted it."""
        del self.children[name]


def ready_flag(child) -> bool:
    return (child.get("data") or {}).get("ready") == "true"


def site_workflow(**kwargs) -> Workflow:
    return Workflow(dep("a", ready=ready_flag), dep("b", "a", **kwargs), dep("c", "b"))


def test_b_is_not_applied_until_a_is_ready():
    ctx, wf = Recorder(), site_workflow()
    obj = ctx.obj
    progress = wf.reconcile(obj, ctx)
    assert ctx.writes == [("apply", "site-a")]
    assert progress.states == {"a": PENDING, "b": WAITING, "c": WAITING}
    assert progress.result == Result.after(60.0)
    assert ctx.conditions["BReady"] == ("False", "Waiting")
    assert ctx.conditions["DependentsReady"] == ("False", "Progressing")

    ctx.children["site-a"]["data"]["ready"] = "true"  # someone else's field; apply keeps it
    ctx.writes.clear()
    progress = wf.reconcile(obj, ctx)
    assert ctx.writes == [("apply", "site-a"), ("apply", "site-b"), ("apply", "site-c")]
    assert progress.done and progress.result is None
    assert progress.children["b"]["metadata"]["labels"][LABEL] == "b"
    assert ctx.conditions["DependentsReady"] == ("True", "AllReady")


def test_a_dependent_no_longer_wanted_is_deleted_after_what_depends_on_it_is_gone():
    wanted = {"b": True}
    ctx = Recorder()
    wf = site_workflow(when=lambda obj: wanted["b"])
    ctx.children["site-a"] = {"kind": "ConfigMap", "data": {"ready": "true"},
                              "metadata": {"name": "site-a"}}
    wf.reconcile(ctx.obj, ctx)
    assert set(ctx.children) == {"site-a", "site-b", "site-c"}

    wanted["b"] = False  # b and c, which depends on it, are no longer wanted
    ctx.writes.clear()
    progress = wf.reconcile(ctx.obj, ctx)
    assert ctx.writes == [("delete", "site-c"), ("apply", "site-a")]  # not b: c is still there
    assert progress.states == {"c": DELETING, "b": DELETING, "a": READY}
    assert ctx.conditions["CReady"] == ("False", "Deleting")

    ctx.writes.clear()
    wf.reconcile(ctx.obj, ctx)  # c terminating: still there, nothing more to do
    assert ctx.writes == [("apply", "site-a")]

    ctx.gone("site-c")
    ctx.writes.clear()
    progress = wf.reconcile(ctx.obj, ctx)
    assert ctx.writes == [("delete", "site-b"), ("apply", "site-a")]
    ctx.gone("site-b")
    progress = wf.reconcile(ctx.obj, ctx)
    assert progress.states == {"c": ABSENT, "b": ABSENT, "a": READY}
    assert progress.done
    assert ctx.conditions["BReady"] == ("False", "NotWanted")


def test_cleanup_deletes_in_reverse_order_and_asks_to_run_again_until_all_are_gone():
    ctx, wf = Recorder(), site_workflow()
    ctx.children["site-a"] = {"kind": "ConfigMap", "data": {"ready": "true"},
                              "metadata": {"name": "site-a"}}
    wf.reconcile(ctx.obj, ctx)
    ctx.writes.clear()
    for gone, deleted in [(None, "site-c"), ("site-c", "site-b"), ("site-b", "site-a")]:
        if gone:
            ctx.gone(gone)
        progress = wf.cleanup(ctx.obj, ctx)
        assert ctx.writes[-1] == ("delete", deleted)
        assert progress.result == Result.after(60.0)  # keeps the finalizer
    ctx.gone("site-a")
    progress = wf.cleanup(ctx.obj, ctx)
    assert progress.done and progress.result is None
    assert ctx.writes == [("delete", "site-c"), ("delete", "site-b"), ("delete", "site-a")]


def test_children_of_an_undeclared_dependent_or_an_old_name_are_deleted():
    ctx, wf = Recorder(), Workflow(dep("a"))
    ctx.children["old"] = {"kind": "ConfigMap", "metadata": {
        "name": "old", "labels": {LABEL: "gone-from-the-class"},
        "ownerReferences": [{"controller": True, "uid": OWNER_UID}]}}
    ctx.children["site-a-v1"] = {"kind": "ConfigMap", "metadata": {
        "name": "site-a-v1", "labels": {LABEL: "a"},
        "ownerReferences": [{"controller": True, "uid": OWNER_UID}]}}
    ctx.children["not-mine"] = {"kind": "ConfigMap", "metadata": {
        "name": "not-mine", "labels": {LABEL: "b"},
        "ownerReferences": [{"controller": True, "uid": "someone-else"}]}}
    progress = wf.reconcile(ctx.obj, ctx)
    assert sorted(ctx.writes) == [("apply", "site-a"), ("delete", "old"),
                                  ("delete", "site-a-v1")]
    assert not progress.done


def test_without_recheck_only_the_watch_moves_a_run_on_but_cleanup_keeps_the_finalizer():
    ctx, wf = Recorder(), Workflow(dep("a", ready=ready_flag), recheck=None)
    progress = wf.reconcile(ctx.obj, ctx)
    assert progress.states == {"a": PENDING} and progress.result is None
    assert wf.cleanup(ctx.obj, ctx).result == Result.after(5.0)


def test_desired_must_name_the_child_and_match_the_declared_kind():
    ctx = Recorder()
    with pytest.raises(ValueError, match="returned kind 'Secret'"):
        Workflow(Dependent("a", "v1", "ConfigMap", desired=lambda o: {
            "kind": "Secret", "metadata": {"name": "x"}})).reconcile(ctx.obj, ctx)
    with pytest.raises(ValueError, match="no metadata.name"):
        Workflow(Dependent("a", "v1", "ConfigMap", desired=lambda o: {})).reconcile(
            ctx.obj, ctx)


def test_desired_may_take_ctx():
    seen = []
    ctx = Recorder()
    Workflow(Dependent("a", "v1", "ConfigMap", desired=lambda o, c: seen.append(c) or {
        "metadata": {"name": "x"}})).reconcile(ctx.obj, ctx)
    assert seen == [ctx]


def test_runs_with_nothing_to_delete_read_the_cache_only(api_server_reads):
    ctx, wf = Recorder(), site_workflow()
    wf.reconcile(ctx.obj, ctx)
    assert api_server_reads == []


def test_a_child_the_cache_does_not_show_yet_still_goes_before_what_it_depends_on(
        api_server_reads):
    ctx, wf = Recorder(), site_workflow()
    ctx.children["site-a"] = {"kind": "ConfigMap", "data": {"ready": "true"},
                              "metadata": {"name": "site-a"}}
    wf.reconcile(ctx.obj, ctx)
    ctx.unseen = {"site-c"}  # created by that run; the watch has not shown it yet
    ctx.writes.clear()
    progress = wf.cleanup(ctx.obj, ctx)
    assert ctx.writes == [("delete", "site-c")]
    assert progress.states == {"a": DELETING, "b": DELETING, "c": DELETING}
    assert api_server_reads == ["ConfigMap"]


class Typed:
    """What a reconciler with a ``resource`` gets: the raw object, and a status patch the run
    writes after ``reconcile``."""

    def __init__(self, obj: dict):
        self.raw = obj

    def __getitem__(self, field: str):
        return self.raw[field]

    def status_patch(self) -> dict:
        return {"status": self.raw.get("status")}


def test_on_a_typed_resource_the_conditions_ride_on_its_status_patch():
    ctx, wf = Recorder(), site_workflow()
    site = Typed({**ctx.obj, "status": {"conditions": [
        {"type": "AReady", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Mine", "status": "True"}]}})
    wf.reconcile(site, ctx)
    assert ctx.status_patches == 0 and ctx.conditions == {}
    conditions = {c["type"]: c for c in site.raw["status"]["conditions"]}
    assert conditions["Mine"] == {"type": "Mine", "status": "True"}
    assert conditions["AReady"]["reason"] == "NotReady"
    assert conditions["AReady"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"  # no flip
    assert conditions["BReady"]["reason"] == "Waiting"
    assert conditions["DependentsReady"]["status"] == "False"


def test_only_the_kinds_with_something_to_delete_are_read_from_the_api_server(
        api_server_reads):
    ctx = Recorder()
    wf = Workflow(dep("a"), Dependent("b", "v1", "Secret", desired=cm("b"),
                                      when=lambda obj: False))
    assert wf.reconcile(ctx.obj, ctx).states == {"a": READY, "b": ABSENT}
    assert api_server_reads == ["Secret"]
