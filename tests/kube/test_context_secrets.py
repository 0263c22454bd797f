"""Secrets a reconciler owns or watches: the shared cache never holds their data, so a run reads
them from the api-server - with their data - and an unchanged owned Secret is not written
again on every run."""

from __future__ import annotations

import threading

import pytest
from reconcilers._kube import cache, kube as door
from reconcilers._watch.enqueuer import Enqueuer
from reconcilers._watch.streams import build_streams
from reconcilers.api import Owns, Reconciler, ReconcilerRegistry, register
from reconcilers._base.vocab import GVR
from tests.kube.test_context import GROUP, VERSION, probe, run_once  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)

SECRETS = GVR.of("v1", "Secret")


def test_an_owned_secret_is_read_with_its_data_and_written_only_when_it_changes(
        kube, probe, namespace, redis_client, settings):  # noqa: F811
    settings.RECONCILERS_NAMESPACES = namespace
    reg = ReconcilerRegistry()
    seen: list[tuple[dict | None, int]] = []

    @register(registry=reg)
    class Keeper(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"
        owns = [Owns("v1", "Secret")]

        def reconcile(self, obj, ctx):
            ctx.create_or_update({"apiVersion": "v1", "kind": "Secret",
                                  "metadata": {"name": "credentials"},
                                  "stringData": {"password": f"pw-{obj['spec']['value']}"}})
            found = ctx.get("v1", "Secret", "credentials")
            (listed,) = [s for s in ctx.list("v1", "Secret")
                         if s["metadata"]["name"] == "credentials"]
            assert listed.get("data") == found.get("data")
            seen.append(((found or {}).get("data"), len(ctx.writes)))

    run_once(reg, "p", namespace, Keeper.name())
    assert seen[-1] == ({"password": "cHctMQ=="}, 1)

    # The watcher lists the Secrets into the shared cache, as it does for an owned kind ...
    streams = build_streams([Keeper], Enqueuer(threading.Event()), threading.Event())
    (secrets,) = [s for s in streams if s.gvr == SECRETS]
    secrets.reflector.list(door.new_api_client(), initial=True)
    assert cache.is_synced(SECRETS, namespace)
    assert "data" not in cache.get(SECRETS, namespace, "credentials")  # never its data

    # ... yet a run reads the Secret with its data, and writes nothing when nothing changed.
    run_once(reg, "p", namespace, Keeper.name())
    assert seen[-1] == ({"password": "cHctMQ=="}, 0)
