"""Event filters: pure functions over old and new API bodies, and the declarations that use
them (a reconciler's, an ``Owns``', a ``Watches'``) refused at class definition when they could
never work."""

from __future__ import annotations

import pytest

from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base import predicates
from reconcilers._base.vocab import Owns, Watches


def obj(generation=1, labels=None, annotations=None, deleting=False):
    meta = {"name": "x", "generation": generation, "labels": labels or {},
            "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_generation_changed_skips_status_only_updates():
    assert predicates.generation_changed(obj(1), obj(1)) is False
    assert predicates.generation_changed(obj(1), obj(2)) is True


def test_additions_deletions_and_deletion_start_always_pass():
    assert predicates.generation_changed(None, obj())
    assert predicates.generation_changed(obj(), None)
    assert predicates.generation_changed(obj(1), obj(1, deleting=True))


def test_label_and_annotation_predicates():
    assert not predicates.labels_changed(obj(labels={"a": "1"}), obj(labels={"a": "1"}))
    assert predicates.labels_changed(obj(labels={"a": "1"}), obj(labels={"a": "2"}))
    assert predicates.annotations_changed(obj(), obj(annotations={"n": "v"}))


def test_any_of_passes_when_one_passes_and_names_itself():
    either = predicates.any_of(predicates.generation_changed, predicates.labels_changed)
    assert either(obj(1), obj(1, labels={"a": "1"}))
    assert not either(obj(1), obj(1))
    assert either.__name__ == "any_of(generation_changed, labels_changed)"


def test_owns_and_watches_take_predicates_as_the_reconciler_does():
    owns = Owns("apps/v1", "Deployment", predicates=[predicates.generation_changed])
    watches = Watches("v1", "ConfigMap", map=lambda cm: [], predicates=[predicates.labels_changed])
    assert owns.predicates == [predicates.generation_changed]
    assert watches.predicates == [predicates.labels_changed]
    assert Owns("apps/v1", "Deployment").predicates == ()
    assert owns.gvr() == Owns("apps/v1", "Deployment").gvr()


@pytest.mark.parametrize("declared, message", [
    (predicates.generation_changed,
     "predicates takes a list of predicates, not 'generation_changed'; write "
     "predicates=[generation_changed]"),
    (["generation_changed"],
     "'generation_changed' is not a predicate: a predicate is a function (old, new) -> bool, "
     "such as predicates.generation_changed"),
    ([predicates.any_of],
     "any_of makes a predicate of others; call it - any_of(generation_changed, labels_changed)"),
    ([lambda new: True], "predicate <lambda>(new) cannot be called as (old, new)"),
    (3, "predicates takes a list of predicates, not 3"),
])
def test_a_bad_predicate_on_owns_is_refused_with_the_class_and_the_mistake(declared, message):
    with pytest.raises(TypeError) as raised:
        class Apps(Reconciler):
            group, version, kind = "example.com", "v1", "App"
            owns = [Owns("apps/v1", "Deployment", predicates=declared)]
    assert str(raised.value).startswith("Apps: Owns('apps/v1', 'Deployment'): ")
    assert message in str(raised.value)


def test_a_bad_predicate_on_watches_or_the_primary_is_refused_too():
    with pytest.raises(TypeError, match=r"^Users: Watches\('v1', 'ConfigMap'\): None is not a"):
        class Users(Reconciler):
            group, version, kind = "example.com", "v1", "App"
            watches = [Watches("v1", "ConfigMap", map=lambda cm: [], predicates=[None])]
    with pytest.raises(TypeError, match=r"^Apps.predicates: predicates takes a list"):
        class Apps(Reconciler):
            group, version, kind = "example.com", "v1", "App"
            predicates = predicates.generation_changed


def test_predicates_that_take_old_and_new_in_any_callable_form_are_accepted():
    class Check:
        def __call__(self, old, new=None, *rest):
            return True

    either = predicates.any_of(predicates.labels_changed)
    declared = [Check(), either, lambda *changes: True]
    assert predicates.check(declared, "here") == tuple(declared)
