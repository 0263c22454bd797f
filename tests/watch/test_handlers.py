"""From a change to keys: each handler applies its own declaration's predicates - the
reconciler's for the primary resource, the ``Owns``' for a child, the ``Watches``' for a related
object - and a stream's router hands on the keys of the handlers that let it through."""

from __future__ import annotations

import logging

from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.predicates import generation_changed
from reconcilers._base.vocab import Owns, Watches
from reconcilers._base.reconcile import Key, Trigger
from reconcilers._watch.handlers import OWNED, PRIMARY, WATCHED, Handler, Router


def child(generation: int, status: str = "", owner: str = "web", kind: str = "App") -> dict:
    return {"metadata": {"name": f"{owner}-child", "namespace": "ns", "generation": generation,
                         "ownerReferences": [{"apiVersion": "example.com/v1", "kind": kind,
                                              "name": owner, "controller": True}]},
            "status": {"phase": status}}


class Apps(Reconciler):
    group, version, kind = "example.com", "v1", "App"
    owns = [Owns("apps/v1", "Deployment", predicates=[generation_changed])]


class StatusReaders(Reconciler):
    """Another owner of Deployments on the same stream, reading their status."""

    group, version, kind = "example.com", "v1", "Reader"
    owns = [Owns("apps/v1", "Deployment")]


def owned(cls: type[Reconciler]) -> Handler:
    return Handler(cls, OWNED, cls.owns[0])


def test_an_owns_predicate_drops_a_childs_status_only_change():
    handler = owned(Apps)
    assert not handler.passes(child(1, "progressing"), child(1, "available"))
    assert handler.passes(child(1), child(2))
    assert handler.passes(None, child(1))  # creation
    assert handler.passes(child(1), None)  # deletion


def test_an_owns_without_predicates_lets_every_change_through():
    assert owned(StatusReaders).passes(child(1, "progressing"), child(1, "available"))


def test_the_primarys_predicates_do_not_filter_its_children_nor_the_other_way_round():
    class Filtered(Reconciler):
        group, version, kind = "example.com", "v1", "App"
        predicates = [generation_changed]
        owns = [Owns("apps/v1", "Deployment")]

    status_only = (child(1, "progressing"), child(1, "available"))
    assert not Handler(Filtered, PRIMARY).passes(*status_only)
    assert owned(Filtered).passes(*status_only)
    assert Handler(Apps, PRIMARY).passes(*status_only)


def test_a_watches_predicate_filters_its_changes_before_the_map_function():
    mapped = []
    related = Watches("v1", "ConfigMap", map=lambda cm: mapped.append(cm) or ["web"],
                      predicates=[generation_changed])

    class Users(Reconciler):
        group, version, kind = "example.com", "v1", "App"
        watches = [related]

    keys = []
    router = Router([Handler(Users, WATCHED, related)], lambda key, trig: keys.append(key))
    router(Trigger.MODIFIED, child(1, "a"), child(1, "b"))
    assert (keys, mapped) == ([], [])
    router(Trigger.MODIFIED, child(1), child(2))
    assert keys == [Key("apps.example.com", "ns", "web")]


def test_a_change_one_owner_filters_still_reaches_another_on_the_same_stream():
    keys: list[tuple[Key, str]] = []
    router = Router([owned(Apps), owned(StatusReaders)],
                    lambda key, trig: keys.append((key, trig)))
    old = child(1, "progressing", owner="web", kind="Reader")
    new = child(1, "available", owner="web", kind="Reader")
    # The reflector asks first: one handler wants it, so it is journalled (and always cached).
    assert router.wants(old, new)
    router(Trigger.MODIFIED, old, new)
    assert keys == [(Key("readers.example.com", "ns", "web"), Trigger.OWNED)]
    # What each owner's row of the stream's status shows: dropped for one, not the other.
    assert (router.skipped_for("apps.example.com"), router.skipped_for("readers.example.com")) \
        == (1, 0)


def test_a_change_every_handler_filters_is_not_wanted_and_counted_as_skipped():
    keys = []
    router = Router([owned(Apps)], lambda key, trig: keys.append(key))
    old, new = child(1, "progressing"), child(1, "available")
    assert not router.wants(old, new)
    router(Trigger.MODIFIED, old, new)
    assert keys == []
    assert router.skipped_for("apps.example.com") == 1
    router(Trigger.MODIFIED, child(1), child(2))
    assert keys == [Key("apps.example.com", "ns", "web")]


def test_a_predicate_that_raises_lets_the_change_through_and_logs_which(caplog):
    def broken(old, new):
        return old["status"]["missing"] == new["status"]["missing"]

    class Fragile(Reconciler):
        group, version, kind = "example.com", "v1", "App"
        owns = [Owns("apps/v1", "Deployment", predicates=[broken, generation_changed])]

    with caplog.at_level(logging.ERROR, logger="reconcilers._base.predicates"):
        # broken counts as passing; the next predicate still decides.
        assert owned(Fragile).passes(child(1), child(2))
        assert not owned(Fragile).passes(child(1, "a"), child(1, "b"))
    (first, _) = caplog.records
    assert first.getMessage() == ("apps.example.com Owns(apps/v1, Deployment): predicate broken "
                                  "raised on ns/web-child; the change is let through")
    assert first.exc_info[0] is KeyError


def test_a_predicate_that_returns_nothing_lets_the_change_through_and_logs_it(caplog):
    def forgot_return(old, new):
        (old or {}).get("metadata") != (new or {}).get("metadata")

    class Careless(Reconciler):
        group, version, kind = "example.com", "v1", "App"
        owns = [Owns("apps/v1", "Deployment", predicates=[forgot_return])]

    with caplog.at_level(logging.ERROR, logger="reconcilers._base.predicates"):
        assert owned(Careless).passes(child(1, "a"), child(1, "b"))
    assert caplog.records[0].getMessage() == (
        "apps.example.com Owns(apps/v1, Deployment): predicate forgot_return returned None on "
        "ns/web-child, not True or False; the change is let through")
