"""Kubernetes Events from reconcilers, on the real api-server and Redis: aggregated, bounded,
never raised."""

from __future__ import annotations

import pytest

from reconcilers._kube import events, kube
from reconcilers._base.vocab import GVR


@pytest.fixture
def configmap(api, namespace):
    return kube.request(api, "POST", GVR.of("v1", "ConfigMap").path(namespace),
                        {"metadata": {"name": "involved"}}) | {"apiVersion": "v1",
                                                                "kind": "ConfigMap"}


def _events(api, namespace):
    return kube.request(api, "GET", kube.EVENTS.path(namespace))["items"]


def test_an_event_is_written_about_the_object(api, namespace, configmap, redis_client):
    events.record(api, configmap, events.WARNING, "Broken", "it broke")
    (event,) = _events(api, namespace)
    assert (event["type"], event["reason"], event["note"], event.get("series")) == (
        "Warning", "Broken", "it broke", None)
    assert event["regarding"]["uid"] == configmap["metadata"]["uid"]
    assert event["reportingController"] == events.COMPONENT
    # kubectl get/describe read core/v1: the same Event, there too.
    (core,) = kube.request(api, "GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    assert (core["message"], core["involvedObject"]["name"]) == ("it broke", "involved")


def test_repeats_are_counted_in_redis_and_written_at_most_once_per_interval(
        api, namespace, configmap, redis_client):
    for _ in range(20):
        events.record(api, configmap, events.WARNING, "Broken", "again")
    (event,) = _events(api, namespace)
    assert event.get("series") is None  # 19 repeats cost Redis increments, not API writes
    redis_client.delete(*redis_client.keys("operator:event-write:*"))  # the interval passes
    events.record(api, configmap, events.WARNING, "Broken", "again")
    (event,) = _events(api, namespace)
    assert event["series"]["count"] == 21


def test_a_failure_to_record_an_event_is_logged_not_raised(api, configmap, caplog):
    bad = {**configmap, "metadata": {**configmap["metadata"], "namespace": "no-such-ns-x"}}
    events.record(api, bad, events.NORMAL, "Fine", "x")  # the namespace does not exist
    assert "could not record event" in caplog.text
