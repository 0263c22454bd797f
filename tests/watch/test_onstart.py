"""The start pass's fingerprint: what changes it and what must not."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from reconcilers._watch import onstart
from reconcilers._authoring.registry import registry
from reconcilers._base.reconcile import Key

PROBE = "probes.test.operator.local"


def _fingerprint() -> str:
    onstart._source_digest.cache_clear()
    return onstart.fingerprint(registry.get_class(PROBE))


def test_the_source_of_the_app_is_in_it_but_not_its_tests_or_migrations(tmp_path):
    (tmp_path / "reconcilers.py").write_text("def reconcile(): return 1\n")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_initial.py").write_text("# one\n")
    first = onstart._source_digest(tmp_path)

    (tmp_path / "migrations" / "0001_initial.py").write_text("# two\n")
    onstart._source_digest.cache_clear()
    assert onstart._source_digest(tmp_path) == first

    (tmp_path / "helpers.py").write_text("X = 1\n")  # a module the reconciler may call
    onstart._source_digest.cache_clear()
    assert onstart._source_digest(tmp_path) != first


FRAMEWORK = Path(onstart.__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["_kube/context.py", "_run/runner.py",
                                    "_authoring/dependents/workflow.py", "_queue/ledger.py",
                                    "_watch/reflector.py", "api.py"])
def test_an_upgrade_of_any_part_of_the_framework_changes_it(monkeypatch, module):
    """A fix anywhere in the framework must reach the objects it may have left wrong."""
    base = _fingerprint()
    target = FRAMEWORK / module
    read_bytes = Path.read_bytes

    def upgraded(path: Path) -> bytes:
        data = read_bytes(path)
        return data + b"# the upgrade's fix\n" if path.resolve() == target else data

    monkeypatch.setattr(Path, "read_bytes", upgraded)
    assert _fingerprint() != base, f"a change to reconcilers/{module} went unnoticed"


def test_a_setting_the_reconcilers_app_reads_changes_it():
    base = _fingerprint()
    with override_settings(PROBE_NOTE="v2"):
        assert _fingerprint() != base
    assert _fingerprint() == base


def test_per_process_settings_and_the_operators_tuning_do_not():
    """A standby on another probe port, or a retuned queue, must not reconcile everything:
    neither changes what a run of an object writes."""
    base = _fingerprint()
    with override_settings(OPERATOR_WATCHER_HTTP_PORT=9999, OPERATOR_WORKER_HTTP_PORT=9998,
                           RECONCILERS_BACKOFF_BASE=0.5, RECONCILERS_ENQUEUE_WINDOW=0.1,
                           BASE_DIR=Path("/elsewhere"), UNRELATED_TEAM_SETTING="x"):
        assert _fingerprint() == base


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_rotated_credentials_and_djangos_own_settings_do_not():
    base = _fingerprint()
    with override_settings(SECRET_KEY="rotated", CELERY_BROKER_URL="redis://elsewhere:1/0",
                           DEBUG_PROPAGATE_EXCEPTIONS=True, OPERATOR_DB_PASSWORD="x",
                           DATABASES=_with_password("rotated")):
        assert _fingerprint() == base


def _with_password(password: str) -> dict:
    from django.conf import settings

    databases = copy.deepcopy(settings.DATABASES)
    databases["default"]["PASSWORD"] = password
    return databases


def test_credentials_nested_in_a_setting_the_app_reads_do_not(tmp_path):
    """A setting the app names may hold a password beside what decides behaviour."""
    assert onstart._plain_settings({"PROBE_BACKEND"}, lambda name: {
        "url": "https://user:pw1@backend/api", "password": "pw1", "size": 3}) == \
        onstart._plain_settings({"PROBE_BACKEND"}, lambda name: {
            "url": "https://user:pw2@backend/api", "password": "pw2", "size": 3})
    assert onstart._plain_settings({"PROBE_BACKEND"}, lambda name: {"size": 3}) != \
        onstart._plain_settings({"PROBE_BACKEND"}, lambda name: {"size": 4})


def test_a_setting_that_is_not_plain_data_is_left_out():
    base = _fingerprint()
    with override_settings(PROBE_HOOK=lambda: None):
        assert _fingerprint() == base


def test_an_unknown_mode_is_refused():
    with override_settings(RECONCILERS_RECONCILE_ON_START="sometimes"):
        with pytest.raises(ImproperlyConfigured, match="changed, always"):
            onstart.mode()


class _Synced:
    def __init__(self, gvr, namespace):
        self.gvr, self.namespace, self.synced = gvr, namespace, True


@pytest.mark.django_db
def test_the_pass_leaves_out_keys_handed_to_the_enqueuer_but_not_yet_in_the_ledger(
        redis_client):
    """A relist hands its keys to the enqueuer before the stream reads synced; until the
    enqueuer writes them, only it knows them: the pass must not enqueue them a second time
    (one would run, the other would find it running and run it again)."""
    import threading

    from reconcilers._kube import cache
    from reconcilers._watch.enqueuer import Enqueuer
    from reconcilers.models import RegisteredReconciler, WorkItem

    cls = registry.get_class(PROBE)
    RegisteredReconciler.sync_from([cls])
    namespace = "t-handed"
    cache.put_many(cls.primary(), [
        {"apiVersion": "test.operator.local/v1", "kind": "Probe",
         "metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"}}
        for name in ("relisted", "quiet")])
    enqueuer = Enqueuer(threading.Event())  # not started: what it was handed waits in it
    enqueuer.put(Key(PROBE, namespace, "relisted"), "added")

    start_pass = onstart.StartPass([cls], enqueuer)
    start_pass([_Synced(cls.primary(), None)])

    assert start_pass.done
    started = set(WorkItem.objects.filter(reconciler=PROBE).values_list("name", flat=True))
    assert started == {"quiet"}, "a key the relist handed over was enqueued again"
    assert enqueuer.put_so_far() == frozenset(), "the pass is done: nothing to remember"
