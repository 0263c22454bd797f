"""Event filters: pure functions over old and new API bodies."""

from __future__ import annotations

from reconcilers._base import predicates


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
