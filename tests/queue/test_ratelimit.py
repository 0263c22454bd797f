"""The shared token bucket on the real Redis: one token at a time, refilled at the rate, the
wait until the next one told to whoever finds it empty."""

from __future__ import annotations

import time

import pytest

from reconcilers._queue import ratelimit


def test_rates_read_in_celerys_notation():
    assert ratelimit.per_second("10/s") == 10
    assert ratelimit.per_second("120/m") == 2
    assert ratelimit.per_second("0.5/s") == 0.5
    for bad in ("10", "10/d", "-1/s", "0/s", "ten/s"):
        with pytest.raises(ValueError):
            ratelimit.per_second(bad)


def test_the_bucket_gives_one_token_then_says_how_long_to_wait(redis_client):
    assert ratelimit.take("t.example.com", "2/s") == 0
    wait = ratelimit.take("t.example.com", "2/s")
    assert 0.4 <= wait <= 1.01  # the next token in ~0.5 s, plus up to one interval of jitter
    assert ratelimit.take("other.example.com", "2/s") == 0  # a bucket per reconciler
    time.sleep(0.55)
    assert ratelimit.take("t.example.com", "2/s") == 0
