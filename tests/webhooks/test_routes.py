"""``routes.respond``: one request's answer, never an exception out to the server."""

from __future__ import annotations

import json

import pytest

from reconcilers._webhooks import routes


def test_healthz_answers_ok():
    assert routes.respond("GET", "/healthz", None) == (200, {"status": "ok"}, None)


@pytest.mark.parametrize("method, path", [("GET", "/validate"), ("POST", "/elsewhere"),
                                          ("POST", "/healthz")])
def test_another_path_or_method_gets_a_404_naming_the_paths_served(method, path):
    status, body, then = routes.respond(method, path, b"{}")
    assert status == 404 and "/validate, /mutate or /convert" in body["error"]
    assert then is None


@pytest.mark.parametrize("path", sorted(routes.HOOK_PATHS))
def test_an_empty_body_gets_a_400_stating_the_limit(path):
    status, body, then = routes.respond("POST", path, b"")
    assert status == 400 and str(routes.MAX_BODY) in body["error"]
    assert then is None


@pytest.mark.parametrize("path, what", [("/validate", "AdmissionReview"),
                                        ("/mutate", "AdmissionReview"),
                                        ("/convert", "ConversionReview")])
@pytest.mark.parametrize("payload", [b"not json", json.dumps({"kind": "Pod"}).encode()])
def test_a_body_that_is_not_a_review_gets_a_400_with_the_reason_and_no_record(path, what,
                                                                              payload):
    status, body, then = routes.respond("POST", path, payload)
    assert status == 400 and body["error"].startswith(f"bad {what}: ")
    assert then is None
