"""How a worker process shares itself among the keys of one message (``runpool``): at most its
concurrency at once on its run threads, and in the main thread (prefork, solo) one after
another, each under its own deadline. Pure threading, no services."""

from __future__ import annotations

import threading
import time

import pytest

from reconcilers._run import deadlines
from reconcilers._run import pool as runpool


def each(fn):
    """A run loop that runs one entry and takes up nothing: ``fn(item)``'s result."""
    def loop(entry, lane):
        try:
            entry.settle(fn(entry.item))
        except BaseException as exc:  # noqa: BLE001 - the waiting thread re-raises it
            entry.settle(exception=exc)
    return loop


@pytest.fixture
def pool():
    yield runpool
    if runpool._line is not None:
        runpool._line.stop()
    runpool._line = None  # back to "not configured"


def test_runs_of_a_process_never_exceed_its_concurrency_however_messages_were_packed(pool):
    pool.configure(2)
    running, peak, lock = 0, 0, threading.Lock()
    threads: set[str] = set()

    def run(item: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            threads.add(threading.current_thread().name)
        time.sleep(0.05)
        with lock:
            running -= 1
        return item * 10

    results: dict[str, list[int]] = {}

    def message(name: str, items: list[int]) -> None:  # a Celery pool thread
        results[name] = pool.run_all(loop, items)

    loop = each(run)

    celery_threads = [threading.Thread(target=message, args=(n, list(range(i, i + 4))))
                      for i, n in enumerate("abc")]
    celery_threads += [threading.Thread(target=message, args=(n, [7])) for n in "de"]
    for t in celery_threads:
        t.start()
    for t in celery_threads:
        t.join(10)
    assert results == {"a": [0, 10, 20, 30], "b": [10, 20, 30, 40], "c": [20, 30, 40, 50],
                       "d": [70], "e": [70]}
    assert peak == 2
    assert threads == {"run-0", "run-1"}  # never a Celery thread: they hold no connection


def test_every_key_of_a_message_runs_even_when_one_raises(pool):
    pool.configure(2)
    seen: list[int] = []

    def run(item: int) -> int:
        seen.append(item)
        if item == 1:
            raise ConnectionError("database went away")
        return item

    outcome: list[BaseException] = []
    t = threading.Thread(target=lambda: outcome.extend(
        _raised(lambda: pool.run_all(each(run), [0, 1, 2]))))
    t.start()
    t.join(10)
    assert sorted(seen) == [0, 1, 2]
    assert isinstance(outcome[0], ConnectionError)


@pytest.mark.parametrize("threaded", [True, False], ids=["run threads", "main thread"])
def test_an_ending_run_takes_up_the_next_waiting_key_on_its_own_thread(pool, threaded):
    """``Lane.take`` hands the run loop the key waiting longest - out of the line, so no other
    thread runs it - and what the run hands on reaches that key's own run, which follows on
    the same thread; a loop that raises after taking one still leaves it to run."""
    if threaded:
        pool.configure(1)
    ran: list[tuple[int, object, str]] = []

    def loop(entry, lane) -> None:
        while entry is not None:
            item = entry.item
            ran.append((item, entry.handed, threading.current_thread().name))
            nxt = lane.take()
            assert lane.take() is None  # one at a time
            if nxt is not None and item == 0:
                nxt.handed = f"claimed by {item}"
            if item == 1:
                raise RuntimeError("after taking the next one up")
            entry.settle(item)
            entry = lane.next_up()

    results: list = []
    t = threading.Thread(target=lambda: results.extend(_raised(
        lambda: results.append(pool.run_all(loop, [0, 1, 2])))))
    if threaded:
        t.start()
        t.join(10)
    else:
        t.run()  # in this (main) thread
    assert [(i, handed) for i, handed, _ in ran] == [
        (0, pool.NOTHING), (1, "claimed by 0"), (2, pool.NOTHING)]
    assert len({name for _, _, name in ran}) == 1
    assert isinstance(results[0], RuntimeError)


def test_a_run_loop_takes_up_only_keys_it_runs(pool):
    """A waiting entry of another loop is left in the line for its own loop to run."""
    pool.configure(1)
    gate, took = threading.Event(), []

    def first(entry, lane) -> None:
        gate.wait(5)
        took.append(lane.take())
        entry.settle("first")

    t = threading.Thread(target=lambda: pool.run_all(first, ["a"]))
    t.start()
    time.sleep(0.1)
    other = threading.Thread(target=lambda: took.append(pool.run_all(each(str), ["b"])))
    other.start()
    time.sleep(0.1)
    gate.set()
    t.join(10)
    other.join(10)
    assert took == [None, ["b"]]


def _raised(fn) -> list[BaseException]:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test looks at it
        return [exc]
    return []


def test_in_the_main_thread_keys_run_one_by_one_each_held_to_its_own_deadline(pool):
    """A prefork child: the pool's limit covers the whole message, so each key's soft limit
    is raised in the main thread by ``deadlines``."""
    assert threading.current_thread() is threading.main_thread()
    order: list[str] = []

    def run(item: str) -> str:
        order.append(item)
        with deadlines.guard(item, soft=0.2, hard=5):
            if item == "spins":
                end = time.monotonic() + 3
                try:
                    while time.monotonic() < end:
                        pass
                except deadlines.SOFT_LIMIT_ERROR:
                    return "interrupted"
            return "done"

    started = time.monotonic()
    assert pool.run_all(each(run), ["quick", "spins", "after"]) == [
        "done", "interrupted", "done"]
    assert order == ["quick", "spins", "after"]
    assert time.monotonic() - started < 2
    with deadlines.guard("outside a message", soft=0.05, hard=5):  # the pool's job again
        time.sleep(0.2)


def test_a_key_holding_the_gil_in_c_past_its_hard_limit_still_ends_the_process(tmp_path):
    """In a prefork child the pool's own kill comes only after the whole message; a run
    stuck in C with the GIL held (here a catastrophic regex) starves the watchdog thread, so a
    C timer ends the process just past the hard limit - well inside the key's lease."""
    import subprocess
    import sys

    script = (
        "import re, time\n"
        "from reconcilers._run import deadlines\n"
        "with deadlines.everywhere(), deadlines.guard('stuck', soft=0.2, hard=0.5):\n"
        "    re.match(r'(a+)+$', 'a' * 64 + 'b')\n"
        "print('survived')\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0 and "survived" not in done.stdout
    assert "Timeout" in done.stderr  # faulthandler's traceback of the stuck thread
    assert time.monotonic() - started < 10


def test_a_worker_whose_stderr_is_a_logging_proxy_keeps_its_deadlines(monkeypatch):
    """Celery replaces a worker's sys.stderr with a logging proxy (no file descriptor): the
    C-timer backstop writes to the real stderr, and a key still runs under its deadline."""
    import io
    import sys

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # no fileno(), as Celery's proxy
    with deadlines.everywhere():
        with pytest.raises(deadlines.SOFT_LIMIT_ERROR):
            with deadlines.guard("proxied", soft=0.1, hard=5):
                end = time.monotonic() + 3
                while time.monotonic() < end:
                    pass
