"""Who may read ``/metrics``: the api-server decides (``RECONCILERS_METRICS_SECURE``).

controller-runtime's ``filters.WithAuthenticationAndAuthorization``, in the same two steps: the
caller's bearer token is authenticated by a TokenReview, and the user it names is authorized by
a SubjectAccessReview of the non-resource URL: ``get`` on ``/metrics`` - what a ClusterRole
grants with ``nonResourceURLs: ["/metrics"]``. Both calls go through ``kube.request``, with
the operator's own credentials, which need ``create`` on ``tokenreviews`` and
``subjectaccessreviews`` (``manage.py rbac`` grants it while the setting is on).

A decision is kept by the token's SHA-256 digest, never the token: an allowed one for
``ALLOWED_FOR`` (a scrape every 15 s costs two api-server calls a minute, and a grant taken
back is seen within that, as controller-runtime's token cache), a refused one for
``REFUSED_FOR`` (a grant made after a refusal is seen within that, as controller-runtime's deny
cache). An api-server that cannot answer gives no decision:
the scrape gets 503 and the next one asks again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from reconcilers._base.conf import settings
from reconcilers._base.probes import Secure
from reconcilers._kube import kube

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
PATH, VERB = "/metrics", "get"

ALLOWED_FOR = 60.0  # seconds an allowed token's decision is kept
REFUSED_FOR = 30.0  # seconds a refused token's decision is kept
KEPT = 1024  # decisions kept at most (the oldest go first)
TIMEOUT = 10.0  # seconds each review may take (controller-runtime's TokenAccessReviewTimeout)


@dataclass(frozen=True)
class AccessDecision:
    """What a scrape gets: ``status`` 200 (allowed), 401 (no token, or one the api-server
    does not authenticate), 403 (a user not allowed ``get`` on ``/metrics``) or 503 (no
    answer from the api-server); ``why`` is said to the caller and logged."""

    status: int
    why: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


def secure_metrics() -> Secure | None:
    """How this process secures ``/metrics`` (``probes.start``): ``None`` while
    ``RECONCILERS_METRICS_SECURE`` is off."""
    conf = settings()
    if not conf.metrics_secure:
        return None
    return Secure(Reviewer().decide, conf.metrics_cert_dir)


class Reviewer:
    """Decides scrapes by their ``Authorization`` header. Thread-safe: each scrape is served
    on a thread of its own."""

    def __init__(self, api: kube.ApiClient | None = None, clock=time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[float, AccessDecision]] = OrderedDict()

    def decide(self, authorization: str | None) -> AccessDecision:
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return AccessDecision(401, "no bearer token (an `Authorization: Bearer <token>` header)")
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            kept = self._kept.get(digest)
            if kept is not None and kept[0] > now:
                return kept[1]
        try:
            decision = self._review(token)
        except kube.ApiError as exc:
            log.error("metrics: cannot check a scrape's token with the api-server: %s "
                      "(the operator needs `create` on tokenreviews and "
                      "subjectaccessreviews: manage.py rbac)", exc)
            return AccessDecision(503, "the api-server did not review the token; see the "
                                 "operator's log")
        with self._lock:
            self._kept[digest] = (now + (ALLOWED_FOR if decision.allowed else REFUSED_FOR),
                                  decision)
            self._kept.move_to_end(digest)
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return decision

    def _review(self, token: str) -> AccessDecision:
        api = self._api or kube.api_client()
        review = kube.request(api, "POST", TOKEN_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}}, timeout=TIMEOUT)
        status = review.get("status") or {}
        if not status.get("authenticated"):
            why = status.get("error") or "not authenticated"
            return AccessDecision(401, f"the api-server did not authenticate the token: {why}")
        user = status.get("user") or {}
        name = user.get("username", "")
        access = kube.request(api, "POST", ACCESS_REVIEWS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": name, "groups": user.get("groups") or [],
                     "extra": user.get("extra") or {},
                     **({"uid": user["uid"]} if user.get("uid") else {}),
                     "nonResourceAttributes": {"path": PATH, "verb": VERB}}},
            timeout=TIMEOUT)
        allowed = access.get("status") or {}
        if not allowed.get("allowed"):
            reason = allowed.get("reason") or allowed.get("evaluationError") or "no rule allows it"
            return AccessDecision(403, f"user {name!r} may not {VERB} {PATH}: {reason}", name)
        return AccessDecision(200, "allowed", name)
