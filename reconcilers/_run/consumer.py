"""Celery's worker consumer, with two guards: a lost broker connection never ends the worker,
and a failed acknowledgement never stops it reading.

When the connection to Redis is lost while a message is unacknowledged (every run's message
is, until it ends: ``acks_late``), Celery 5.7 and kombu 5.7 can turn the loss into an exit.
Celery collects the broken connection (``Connection.collect``); when the consuming channel's
``BRPOP`` is still waiting, that read fails inside kombu's close of the channel, which leaves
the channel half-closed and drops the transport's client. Whatever then uses that channel -
Celery's own second close of the connection, which gives the unacknowledged messages back,
or the acknowledgement of a run that ends afterwards - makes kombu build a client from the
dropped one: an ``AttributeError``, not a connection error, so it leaves Celery's handling
and the worker logs "Unrecoverable error" and exits.

Here that error - and only it: raised by kombu's Redis channel building its connection
parameters while the transport's client is ``None`` (``Channel._connparams``) - ends the
close or the acknowledgement (or rejection) with a warning, and Celery reconnects as for any
connection loss. Any other ``AttributeError`` is a bug and goes on as Celery has it. Nothing
is lost: Redis still holds the unacknowledged message and gives it back after its visibility
timeout, the ledger sends the key again long before (its reaper, past
``RECONCILERS_REDISPATCH_AFTER``), and a message of a run that already ended is stale to the
ledger and dropped.

A second guard keeps the worker reading after an acknowledgement fails while its consuming
connection survives (a reset of the connection the acknowledgement took, while a busy
worker's consuming connection carried nothing). kombu's Redis transport removes the message
from Redis before it frees its prefetch slot, so a failed removal keeps the slot taken for
good; once every slot is so taken the worker never reads again, with nothing logged past
Celery's "Couldn't ack". Here such a message's slot is freed; Redis keeps the message as
unacknowledged and gives it back after its visibility timeout, stale by then to the ledger.

``tasks.install`` makes the consumer the app's ``worker_consumer`` unless a project names its
own.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as redis_transport, virtual

log = logging.getLogger(__name__)

CELERY_DEFAULT = "celery.worker.consumer:Consumer"
CONSUMER = f"{__name__}:Consumer"


class Consumer(CeleryConsumer):
    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as error:
            if not _from_a_dropped_client(error):
                raise
            # Raised by the close of the lost connection, which Celery has already dropped
            # (self.connection is None); it reconnects next.
            log.warning("closing the lost broker connection failed (%r); reconnecting: its "
                        "unacknowledged messages come back through Redis and the ledger",
                        error)
            self.connection = None

    def call_soon_ack(self, p: Callable, *args, **kwargs):
        """Celery runs a message's acknowledgement (or rejection) on the event loop; one of a
        message taken on the lost connection must not end the loop."""
        return super().call_soon_ack(_guarded(p), *args, **kwargs)


def _guarded(settle: Callable) -> Callable:
    message = getattr(settle, "__self__", None)  # settle: a Message's ack or reject method

    @functools.wraps(settle)
    def guarded(*args, **kwargs):
        try:
            return settle(*args, **kwargs)
        except AttributeError as error:
            if not _from_a_dropped_client(error):
                raise
            log.warning("could not settle a message taken on a lost broker connection (%r); "
                        "Redis gives it back after its visibility timeout, stale by then to "
                        "the ledger", error)
        finally:
            _free_slot(message)
    return guarded


def _from_a_dropped_client(error: AttributeError) -> bool:
    """Whether ``error`` is the one the guards are for: raised where kombu's Redis channel
    reads its connection parameters (``Channel._connparams``) from a transport whose client -
    the kombu ``Connection`` - was dropped by Celery's collect of the lost connection."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_code.co_name != "_connparams":
        return False
    channel = tb.tb_frame.f_locals.get("self")
    return isinstance(channel, redis_transport.Channel) and channel.connection.client is None


def _free_slot(message) -> None:
    """Free the prefetch slot of a message whose acknowledgement (or rejection) failed: the
    channel's QoS still counts it, as kombu's Redis transport frees it only after Redis
    answered."""
    if message is None or getattr(message, "acknowledged", True):
        return
    try:
        qos = message.channel.qos
        if not isinstance(qos, virtual.QoS):
            return
        qos.get(message.delivery_tag)  # KeyError: not counted (freed, or the channel restored)
        virtual.QoS.ack(qos, message.delivery_tag)  # the slot only: Redis could not be told
    except Exception as exc:  # noqa: BLE001 - a closed channel: its slots went with it
        log.debug("no prefetch slot to free for %r: %r", message.delivery_tag, exc)
        return
    log.warning("the broker did not take a message's acknowledgement; its prefetch slot is "
                "freed so that this worker reads on. Redis gives the message back after its "
                "visibility timeout, stale by then to the ledger")
