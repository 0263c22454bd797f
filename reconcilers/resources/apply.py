"""Install CRDs with server-side apply and wait until the api-server serves them.

Server-side apply (field manager ``django-crd-operator``, forced) makes this idempotent and
safe to run from several places - ``manage.py applycrds``, the watcher at start-up - since
applying an unchanged manifest is a no-op that leaves ``resourceVersion`` alone. That no-op is
how "unchanged" is told apart from "updated".

A converting CRD's manifest names the in-cluster webhook Service; where a webhook server has
registered itself instead (``manage.py webhook serve --register``: a URL and its CA, as on the
local stack and compose) or cert-manager has injected the CA bundle, re-applying the manifest
keeps that registration, so a watcher starting up never cuts the api-server off from its
conversion webhook. A manifest that no longer converts drops the live registration first,
whoever made it: a CRD with strategy ``None`` may carry no webhook, and server-side apply
removes only the fields its own manager set.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Iterable, Mapping

from reconcilers._kube import kube
from .base import Resource
from .crd import crd

__all__ = ["apply_crds", "wait_established", "NotEstablished", "FIELD_MANAGER",
           "CREATED", "UPDATED", "UNCHANGED"]

FIELD_MANAGER = "django-crd-operator"
CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"
CRD_PATH = kube.CRDS.path()


class NotEstablished(Exception):
    """The api-server did not establish a CRD in time, or refused its names."""


def apply_crds(resources: Iterable[type[Resource] | Mapping[str, Any]],
               api_client: kube.ApiClient, *, field_manager: str = FIELD_MANAGER,
               timeout: float = 60.0) -> list[tuple[str, str]]:
    """Apply the CRD of each resource class (or CRD manifest dict) and wait for
    ``Established``; return ``[(crd name, "created" | "updated" | "unchanged"), ...]``.

    API errors propagate as ``reconcilers._kube.kube.ApiError``."""
    results = []
    for item in resources:
        body = dict(item) if isinstance(item, Mapping) else crd(item)
        name = body["metadata"]["name"]
        before = _get(api_client, name)
        if before is not None:
            body = _keep_conversion_registration(body, before)
            _drop_conversion_registration(api_client, body, before)
        after = kube.request(api_client, "PATCH", kube.CRDS.path(None, name), body,
                             query={"fieldManager": field_manager, "force": "true"},
                             content_type=kube.APPLY_PATCH)
        if before is None:
            outcome = CREATED
        elif before["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]:
            outcome = UNCHANGED
        else:
            outcome = UPDATED
        results.append((name, outcome))
    deadline = time.monotonic() + timeout
    for name, _ in results:
        wait_established(api_client, name, deadline - time.monotonic())
    return results


def _keep_conversion_registration(body: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    wanted = ((body.get("spec") or {}).get("conversion") or {})
    registered = ((live.get("spec") or {}).get("conversion") or {})
    if wanted.get("strategy") != "Webhook" or registered.get("strategy") != "Webhook":
        return body
    want = (wanted.get("webhook") or {}).get("clientConfig") or {}
    have = dict((registered.get("webhook") or {}).get("clientConfig") or {})
    if "url" in have or (have.get("service") == want.get("service") and "caBundle" in have):
        body = copy.deepcopy(body)
        body["spec"]["conversion"]["webhook"]["clientConfig"] = have
    return body


def _drop_conversion_registration(api_client: kube.ApiClient, body: dict[str, Any],
                                  live: dict[str, Any]) -> None:
    wanted = ((body.get("spec") or {}).get("conversion") or {}).get("strategy", "None")
    registered = ((live.get("spec") or {}).get("conversion") or {}).get("strategy", "None")
    if wanted == "None" and registered == "Webhook":
        kube.request(api_client, "PATCH", kube.CRDS.path(None, body["metadata"]["name"]),
                     {"spec": {"conversion": {"strategy": "None", "webhook": None}}},
                     content_type=kube.MERGE_PATCH)


def wait_established(api_client: kube.ApiClient, name: str, timeout: float) -> None:
    """Block until CRD ``name`` is ``Established`` (its resources can be used)."""
    deadline = time.monotonic() + max(timeout, 0)
    while True:
        conditions = {c["type"]: c for c in
                      ((_get(api_client, name) or {}).get("status") or {}).get("conditions") or []}
        if conditions.get("Established", {}).get("status") == "True":
            return
        refused = conditions.get("NamesAccepted", {})
        if refused.get("status") == "False":
            raise NotEstablished(f"{name}: names not accepted: {refused.get('message', '')}")
        if time.monotonic() >= deadline:
            raise NotEstablished(f"{name} was not Established within {timeout:.0f}s")
        time.sleep(0.1)


def _get(api_client: kube.ApiClient, name: str) -> dict[str, Any] | None:
    return kube.get_or_none(api_client, kube.CRDS.path(None, name))
