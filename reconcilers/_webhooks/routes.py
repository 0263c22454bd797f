"""One request's answer: ``respond(method, path, body)`` gives ``(status, JSON body, what to
run once it is sent)`` for ``POST /validate``, ``/mutate``, ``/convert`` and ``GET /healthz``.

The rule: any other path or method gets a 404 naming the paths served, and a body that is not
an AdmissionReview or ConversionReview a 400 with the reason - never an exception out to the
server. Why: anything that reaches the port can send anything, and a malformed call must not
cost the api-server's calls their worker; the HTTP side (``server``) stays free of hook logic,
and this is tested without a socket. A call's record (``calls``) is what runs once the answer
is sent, so writing it never delays admission.
"""

from __future__ import annotations

import json
from typing import Callable

from reconcilers._webhooks import admission, calls

MAX_BODY = 3 * 1024 * 1024  # the api-server's own request limit is 3 MiB

HOOK_PATHS = {"/validate": admission.VALIDATE, "/mutate": admission.MUTATE,
              "/convert": admission.CONVERT}


def respond(method: str, path: str, body: bytes | None) -> tuple[int, dict, Callable | None]:
    """``(status, JSON body, what to run once it is sent)`` for one request."""
    if path == "/healthz" and method == "GET":
        return 200, {"status": "ok"}, None
    hook = HOOK_PATHS.get(path)
    if hook is None or method != "POST":
        return 404, {"error": f"no {method} {path} here; POST /validate, /mutate or "
                              "/convert"}, None
    if not body:
        return 400, {"error": "a JSON review body is required (at most "
                              f"{MAX_BODY} bytes)"}, None
    try:
        review = json.loads(body)
        if hook == admission.CONVERT:
            return 200, admission.convert(review), None
        outcome = admission.review(review, hook)
    except (ValueError, admission.BadReview) as exc:  # JSONDecodeError is a ValueError
        what = "ConversionReview" if hook == admission.CONVERT else "AdmissionReview"
        return 400, {"error": f"bad {what}: {exc}"}, None
    # The record is written after the api-server has its answer, not before.
    return 200, outcome.response, lambda: calls.record(outcome)
