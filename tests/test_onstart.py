"""The start pass's fingerprint: what changes it and what must not."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from reconcilers._watch import onstart
from reconcilers._authoring.registry import registry

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


def test_a_setting_of_the_users_app_or_the_operator_changes_it():
    base = _fingerprint()
    with override_settings(PROBE_NOTE="v2"):
        assert _fingerprint() != base
    with override_settings(RECONCILERS_BACKOFF_BASE=0.5):
        assert _fingerprint() != base
    assert _fingerprint() == base


def test_rotated_credentials_and_djangos_own_settings_do_not():
    base = _fingerprint()
    with override_settings(SECRET_KEY="rotated", CELERY_BROKER_URL="redis://elsewhere:1/0",
                           DEBUG_PROPAGATE_EXCEPTIONS=True, OPERATOR_DB_PASSWORD="x"):
        assert _fingerprint() == base


def test_a_setting_that_is_not_plain_data_is_left_out():
    base = _fingerprint()
    with override_settings(PROBE_HOOK=lambda: None):
        assert _fingerprint() == base


def test_an_unknown_mode_is_refused():
    with override_settings(RECONCILERS_RECONCILE_ON_START="sometimes"):
        with pytest.raises(ImproperlyConfigured, match="changed, always"):
            onstart.mode()
