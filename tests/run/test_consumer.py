"""The worker consumer's guards (``reconcilers._run.consumer``) end the one error they are for -
kombu's Redis channel building a client after Celery's collect of the lost connection dropped
the transport's client - and no other: any other ``AttributeError`` in Celery's
connection-loss handler, or in an acknowledgement, is a bug and must leave as Celery has it.

The known error is kombu's own, raised by its code from the state the collect leaves; the
whole path (a worker losing Redis with messages unacknowledged, in both pools) is
``e2e/test_broker_faults.py``."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import kombu
import pytest
from celery import Celery
from celery.worker.consumer import Consumer as CeleryConsumer

from reconcilers._run.consumer import Consumer, _guarded


def _dropped_client_error(redis_url: str) -> None:
    """What Celery's second close of a lost connection, or an acknowledgement after it, meets:
    kombu's Redis channel building a client while its transport's client - the kombu
    Connection, which ``Connection.collect`` sets to ``None`` - is gone."""
    connection = kombu.Connection(redis_url)
    channel = connection.channel()
    channel.connection.client = None  # the state Connection.collect leaves the transport in
    channel.qos.restore_unacked()  # builds a client: AttributeError from kombu


def _unrelated_error() -> None:
    return None.no_such_attribute  # a bug anywhere else: an AttributeError too


@pytest.fixture
def consumer():
    from django.conf import settings

    app = Celery("consumer-test", broker=settings.REDIS_URL, set_as_current=False)
    made = Consumer(lambda request: None, app=app, hostname="consumer-test",
                    controller=SimpleNamespace(use_eventloop=False))
    made.connection = SimpleNamespace()  # the lost one; the handler drops it
    return made


def test_the_close_of_a_connection_whose_transport_lost_its_client_is_ended_with_a_warning(
        consumer, monkeypatch, caplog):
    from django.conf import settings

    def celery_handler(self, exc):
        self.connection = None  # as Celery's handler does before its close
        _dropped_client_error(settings.REDIS_URL)

    monkeypatch.setattr(CeleryConsumer, "on_connection_error_after_connected", celery_handler)
    with caplog.at_level(logging.WARNING, logger="reconcilers._run.consumer"):
        consumer.on_connection_error_after_connected(ConnectionError("lost"))
    assert consumer.connection is None  # Celery reconnects next
    assert "closing the lost broker connection failed" in caplog.text


def test_any_other_attribute_error_in_the_connection_loss_handler_is_not_swallowed(
        consumer, monkeypatch):
    def celery_handler(self, exc):
        _unrelated_error()

    monkeypatch.setattr(CeleryConsumer, "on_connection_error_after_connected", celery_handler)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        consumer.on_connection_error_after_connected(ConnectionError("lost"))


def test_an_acknowledgement_on_a_connection_whose_transport_lost_its_client_is_dropped(
        caplog):
    from django.conf import settings

    with caplog.at_level(logging.WARNING, logger="reconcilers._run.consumer"):
        _guarded(_dropped_client_error)(settings.REDIS_URL)
    assert "could not settle a message taken on a lost broker connection" in caplog.text


def test_any_other_attribute_error_in_an_acknowledgement_is_not_swallowed():
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _guarded(_unrelated_error)()


def test_celery_settles_messages_through_the_method_the_guard_overrides():
    """The acknowledgement guard overrides ``Consumer.call_soon_ack``, through which Celery
    5.7 runs every acknowledgement and rejection. A Celery without it never calls the
    override: the guard would be silently absent."""
    import inspect

    assert "call_soon_ack" in vars(CeleryConsumer)
    assert "call_soon_ack" in inspect.getsource(CeleryConsumer.create_task_handler)
