"""Who may read ``/metrics`` (``_kube.reviews``), decided by the real api-server's TokenReview
and SubjectAccessReview, and the secure ``/metrics`` port that asks it (``probes.start``)."""

from __future__ import annotations

import logging
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconcilers._base import probes
from reconcilers._kube import kube, reviews
from tests.helpers import free_port, http_get, https_get, wait_for


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def test_a_token_allowed_get_on_metrics_passes_and_every_other_is_refused(
        api, metrics_tokens, namespace):
    reviewer = reviews.Reviewer(api)
    allowed = reviewer.decide(_bearer(metrics_tokens["scraper"]))
    assert (allowed.status, allowed.user) == (
        200, f"system:serviceaccount:{namespace}:scraper")
    stranger = reviewer.decide(_bearer(metrics_tokens["stranger"]))
    assert stranger.status == 403
    assert f"system:serviceaccount:{namespace}:stranger" in stranger.why
    assert "may not get /metrics" in stranger.why
    forged = reviewer.decide(_bearer("not-a-token"))
    assert forged.status == 401 and "did not authenticate" in forged.why
    for header in (None, "", "Bearer ", "Basic c2NyYXBlcjpzZWNyZXQ=", metrics_tokens["scraper"]):
        assert reviewer.decide(header).status == 401, header


def test_a_decision_is_kept_for_a_while_then_asked_again(api, kube, metrics_tokens, namespace):
    """A scrape every 15 s must not cost two api-server calls each: the allowed token's
    decision holds for ``ALLOWED_FOR`` even after its grant is gone, and no longer."""
    from kubernetes import client

    now = [0.0]
    reviewer = reviews.Reviewer(api, clock=lambda: now[0])
    scraper = _bearer(metrics_tokens["scraper"])
    assert reviewer.decide(scraper).allowed
    client.RbacAuthorizationV1Api(kube).delete_cluster_role_binding(
        f"metrics-reader-{namespace}")
    # The api-server's own RBAC has seen the binding go once a reviewer of its own refuses.
    wait_for(lambda: reviews.Reviewer(api).decide(scraper).status == 403, timeout=30,
             what="the api-server to refuse the unbound ServiceAccount")
    now[0] += reviews.ALLOWED_FOR - 1
    assert reviewer.decide(scraper).allowed
    now[0] += 2
    assert reviewer.decide(scraper).status == 403


def test_an_operator_without_the_right_to_review_answers_503_and_logs_the_fix(
        api, metrics_tokens, caplog):
    """The operator's own credentials lack ``create`` on tokenreviews: no decision is made,
    the scrape gets 503 and the log says what grant is missing."""
    from kubernetes import client

    own = api.configuration
    configuration = client.Configuration()
    configuration.host = own.host
    configuration.ssl_ca_cert = own.ssl_ca_cert
    configuration.api_key = {"authorization": _bearer(metrics_tokens["stranger"])}
    powerless = kube.ApiClient(configuration)
    try:
        with caplog.at_level(logging.ERROR, logger="reconcilers._kube.reviews"):
            decision = reviews.Reviewer(powerless).decide(_bearer(metrics_tokens["scraper"]))
    finally:
        powerless.close()
    assert decision.status == 503
    assert "tokenreviews" in caplog.text and "manage.py rbac" in caplog.text


@pytest.fixture
def secure_endpoint(api):
    """A process's endpoints with ``/metrics`` secured by the api-server's reviews: the
    probe port's and the metrics port's numbers."""
    endpoint = probes.Endpoint("test", lambda: {"loop": True}, lambda: {"ready": True})
    probe_port, metrics_port = free_port(), free_port()
    servers = probes.start(endpoint, probe_port, metrics_port,
                           probes.Secure(reviews.Reviewer(api).decide))
    assert len(servers) == 2
    yield probe_port, metrics_port
    for server in servers:
        server.shutdown()
        server.server_close()


def test_secure_metrics_are_served_over_https_to_an_allowed_token_only(
        secure_endpoint, metrics_tokens, namespace, caplog):
    probe_port, metrics_port = secure_endpoint
    status, body, _ = https_get(metrics_port, "/metrics", metrics_tokens["scraper"])
    assert status == 200
    families = {f.name for f in text_string_to_metric_families(body)}
    assert "rest_client_requests" in families  # the reviews' own calls, counted
    with caplog.at_level(logging.WARNING, logger="reconcilers._base.probes"):
        status, body, _ = https_get(metrics_port, "/metrics", metrics_tokens["stranger"])
    assert status == 403 and f"system:serviceaccount:{namespace}:stranger" in body
    assert "test: refused a scrape from 127.0.0.1 (403): user" in caplog.text
    for token in (None, "not-a-token"):
        status, body, headers = https_get(metrics_port, "/metrics", token)
        assert status == 401, (token, body)
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    # Only /metrics on the secure port; the kubelet's probes stay plain, without a token.
    assert https_get(metrics_port, "/healthz", metrics_tokens["scraper"])[0] == 404
    with pytest.raises(OSError):  # plain HTTP to the TLS port gets no answer
        http_get(metrics_port, "/metrics")
    assert http_get(probe_port, "/healthz")[0] == 200
    assert http_get(probe_port, "/readyz")[0] == 200
    status, body = http_get(probe_port, "/metrics")
    assert status == 404 and f"HTTPS on port {metrics_port}" in body


def test_a_connection_that_never_says_hello_holds_up_no_other_scrape(
        secure_endpoint, metrics_tokens):
    """The handshake is made on the connection's own thread: a client that connects and
    sends nothing must not keep the server from accepting the next one."""
    _, metrics_port = secure_endpoint
    # Accepted first: the kernel hands connections over in the order they were made.
    with socket.create_connection(("127.0.0.1", metrics_port)):
        status, _, _ = https_get(metrics_port, "/metrics", metrics_tokens["scraper"])
    assert status == 200
