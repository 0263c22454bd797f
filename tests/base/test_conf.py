"""Typed settings: one frozen object, read once, from Django settings or the environment."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from reconcilers._base.conf import Settings, settings


def test_defaults_are_typed_and_documented():
    conf = settings()
    assert conf.backoff_base == 0.005 and conf.leader_election is True
    for name, value, default, doc in conf.table():
        assert name.startswith("RECONCILERS_") and doc


def test_a_django_setting_wins_and_a_change_is_seen(settings):
    settings.RECONCILERS_BACKOFF_MAX = 30
    from reconcilers._base.conf import settings as read

    assert read().backoff_max == 30.0


def test_the_environment_is_read_and_cast(monkeypatch):
    monkeypatch.setenv("RECONCILERS_LIST_PAGE_SIZE", "42")
    monkeypatch.setenv("RECONCILERS_LEADER_ELECTION", "off")
    settings.cache_clear()
    try:
        conf = settings()
        assert conf.list_page_size == 42 and conf.leader_election is False
    finally:
        monkeypatch.undo()
        settings.cache_clear()


def test_a_malformed_value_is_a_clear_configuration_error(monkeypatch):
    monkeypatch.setenv("RECONCILERS_ENQUEUE_BATCH", "lots")
    settings.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="RECONCILERS_ENQUEUE_BATCH='lots'"):
            settings()
    finally:
        monkeypatch.undo()
        settings.cache_clear()


def test_every_setting_is_read_once():
    assert settings() is settings()
    assert len(list(Settings.fields())) == len(settings().table())


def test_the_configuration_doc_lists_every_setting_as_the_code_declares_it():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "running" / "configuration.md").read_text()
    assert Settings.markdown() in doc
