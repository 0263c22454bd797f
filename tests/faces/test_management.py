"""``manage.py resync`` and ``manage.py history``: thin commands over the ledger and history."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from reconcilers.models import ReconcileRecord, WorkItem

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "probes.test.operator.local"


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_resync_one_object_enqueues_it_with_the_manual_trigger(redis_client):
    assert "enqueued 1 key(s)" in run("resync", PROBE, "--namespace", "ns1", "--name", "p-1")
    item = WorkItem.objects.get()
    assert (item.reconciler, item.namespace, item.name) == (PROBE, "ns1", "p-1")
    assert item.state == "queued" and item.pending_triggers == ["manual"]


@pytest.mark.parametrize("args, message", [
    (("nope.example.com",), "unknown reconciler 'nope.example.com'"),
    ((PROBE, "--namespace", "Bad_NS", "--name", "x"), "not a valid namespace"),
    ((PROBE, "--namespace", "ns", "--name", "<script>"), "not a valid object name"),
    ((PROBE, "--name", "x"), "namespaced: give the object's namespace"),
])
def test_resync_rejects_bad_input_and_enqueues_nothing(args, message, redis_client):
    with pytest.raises(CommandError, match=message):
        run("resync", *args)
    assert not WorkItem.objects.exists()


def test_history_prints_one_objects_runs_in_time_order():
    now = timezone.now()
    for i, outcome in enumerate(["error", "success"]):
        ReconcileRecord.objects.create(
            reconciler=PROBE, namespace="ns", name="p", triggers=["added"], attempt=i + 1,
            started_at=now + timedelta(seconds=i), finished_at=now + timedelta(seconds=i, milliseconds=3),
            duration_ms=3, outcome=outcome, resource_version=str(100 + i), generation=1,
            error_message="boom" if outcome == "error" else "")
    ReconcileRecord.objects.create(
        reconciler=PROBE, namespace="ns", name="other", started_at=now, finished_at=now,
        duration_ms=1, outcome="success")
    rows = [json.loads(line) for line in run("history", PROBE, "ns/p", "--json").splitlines()]
    assert [(r["outcome"], r["attempt"], r["resourceVersion"]) for r in rows] == [
        ("error", 1, "100"), ("success", 2, "101")]
    text = run("history", PROBE, "ns/p")
    assert text.index("error") < text.index("success") and "boom" in text


def test_history_of_an_unknown_object_says_so():
    with pytest.raises(CommandError, match="no runs recorded"):
        run("history", PROBE, "ns/ghost")


def test_ensureadmin_refuses_a_weak_password(monkeypatch):
    from django.contrib.auth import get_user_model

    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "boss")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "password")
    with pytest.raises(CommandError, match="DJANGO_SUPERUSER_PASSWORD is refused: .*common"):
        run("ensureadmin")
    assert not get_user_model().objects.filter(username="boss").exists()
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-long-and-unusual-passphrase-42")
    assert "created admin user 'boss'" in run("ensureadmin")


def test_ensureadmin_sets_the_password_but_never_reenables_an_admin_staff_disabled(monkeypatch):
    """It runs after every migrate: an admin account staff disabled or demoted (a leaver's,
    a compromised one) stays so; the password from the environment is still set."""
    from django.contrib.auth import get_user_model

    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "boss")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-long-and-unusual-passphrase-42")
    assert "created admin user 'boss'" in run("ensureadmin")
    user = get_user_model().objects.get(username="boss")
    assert user.is_active and user.is_staff and user.is_superuser
    user.is_active = user.is_staff = user.is_superuser = False
    user.save()

    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "another-long-unusual-phrase-43")
    out = run("ensureadmin")
    user.refresh_from_db()
    assert not (user.is_active or user.is_staff or user.is_superuser)
    assert user.check_password("another-long-unusual-phrase-43")
    assert "updated admin user 'boss'" in out and "left disabled" in out


def test_the_projects_migrations_are_complete():
    """makemigrations --check under this repository's settings (the package test does it
    under a user's)."""
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
