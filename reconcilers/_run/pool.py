"""How a worker process shares itself among the keys its messages carry.

A message may carry several keys of one reconciler (``RECONCILERS_KEYS_PER_MESSAGE``): one
delivery and one ack for all of them. Each key is still claimed, run and recorded on its own,
as if it had a message of its own; this module only decides where and in what order those runs
happen:

- In Celery's thread pool (``configure`` was called with its concurrency) every key - a
  message of one key too - waits in one first-in-first-out line of this process and runs on
  one of its ``size`` run threads: a process never runs more keys at once than its
  concurrency, however its messages were packed, and Celery's own threads only wait, so only
  run threads hold a database connection.
- Where the pool runs tasks in the main thread (a prefork child, the solo pool) a message's
  keys run one after another, each under its own deadline (``deadlines.everywhere``): the
  pool's own limit is per message.

Either way a run that is ending may take up the next waiting key itself (``take_next``): the
runner then ends one run and claims the next in one statement, as client-go's worker calls
``Done`` and then ``Get``.

A run thread stuck past its run's hard limit is abandoned (``abandonable``): the run's outcome
is handed to whoever waits for it, a new thread takes its place in the line, and the stuck one
ends when - if ever - its run returns.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, Generic, Sequence, TypeVar

from reconcilers._run import deadlines

T = TypeVar("T")
R = TypeVar("R")

NOT_TAKEN = object()  # ``Waiting.taken`` before the run that took it up says how it went


class Waiting(Generic[T]):
    """A key waiting for a run thread; ``taken`` is what the run that took it up
    (``take_next``) passes on to it - the runner's claim - or ``NOT_TAKEN``."""

    __slots__ = ("item", "fn", "future", "taken")

    def __init__(self, item: T, fn: Callable[[T, Any], Any]) -> None:
        self.item, self.fn, self.future = item, fn, Future()
        self.taken: Any = NOT_TAKEN

    def run(self) -> None:
        try:
            result = self.fn(self.item, self.taken)
        except BaseException as exc:  # noqa: BLE001 - the waiting thread re-raises it
            self.settle(exception=exc)
        else:
            self.settle(result)

    def settle(self, result: Any = None, exception: BaseException | None = None) -> bool:
        """Hand the outcome to whoever waits, unless an abandonment already did."""
        try:
            if exception is not None:
                self.future.set_exception(exception)
            else:
                self.future.set_result(result)
            return True
        except InvalidStateError:
            return False


class _Line:
    """The process's line of waiting keys and the run threads that work it off."""

    def __init__(self, size: int) -> None:
        self.waiting: collections.deque[Waiting] = collections.deque()
        self.ready = threading.Condition()
        self.stopped = False
        self.abandoned: set[threading.Thread] = set()  # stuck, replaced, not yet returned
        self.started = 0
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"run-{self.started}", daemon=True)
        self.started += 1
        thread.start()

    def abandon(self, thread: threading.Thread) -> int:
        """Replace ``thread``, stuck in a run; it ends when that run returns. Returns how many
        abandoned threads are still stuck."""
        with self.ready:
            if thread not in self.abandoned:
                self.abandoned.add(thread)
                self._start_thread()
            return len(self.abandoned)

    def put(self, entries: Sequence[Waiting]) -> None:
        with self.ready:
            self.waiting.extend(entries)
            self.ready.notify(len(entries))

    def pop(self) -> Waiting | None:
        with self.ready:
            return self.waiting.popleft() if self.waiting else None

    def stop(self) -> None:
        with self.ready:
            self.stopped = True
            self.ready.notify_all()

    def _work(self) -> None:
        _local.next = self.pop
        _local.line = self
        me = threading.current_thread()
        while True:
            with self.ready:
                while not self.waiting and not self.stopped:
                    self.ready.wait()
                if self.stopped and not self.waiting:
                    return
                entry: Waiting | None = self.waiting.popleft()
            while entry is not None:
                entry = _run_taking(entry)
                with self.ready:
                    if me in self.abandoned:  # replaced while stuck: its successor works on
                        self.abandoned.discard(me)
                        if entry is not None:  # never taken by an abandoned run; put back
                            self.waiting.appendleft(entry)
                            self.ready.notify()
                        return


_local = threading.local()
_line: _Line | None = None
_lock = threading.Lock()


def configure(size: int) -> None:
    """This process runs at most ``size`` keys at once, on as many run threads."""
    global _line
    with _lock:
        old, _line = _line, _Line(max(1, size))
    if old is not None:
        old.stop()


def configured() -> bool:
    """Whether this process runs keys on run threads (a thread-pool worker)."""
    return _line is not None


def take_next() -> Waiting | None:
    """From inside a run: the key this run thread takes up next, now - out of the line, so no
    other thread runs it - or ``None`` (nothing waits, or this run already took one). Set
    its ``taken`` before the run ends; it runs on this thread right after."""
    if getattr(_local, "taken", NOT_TAKEN) is not None or getattr(_local, "next", None) is None:
        return None
    entry = _local.taken = _local.next()
    return entry


def _run_taking(entry: Waiting) -> Waiting | None:
    """Run ``entry``; returns the entry its run took up next, if any."""
    _local.taken = None
    _local.current = entry
    try:
        entry.run()
    finally:
        taken, _local.taken = _local.taken, NOT_TAKEN
        _local.current = None
    return taken


class Abandon:
    """What abandoning the calling run thread takes, captured on that thread."""

    def __init__(self, line: _Line, entry: Waiting, thread: threading.Thread) -> None:
        self.line, self.entry, self.thread = line, entry, thread

    def __call__(self, result: Any) -> int:
        """Hand ``result`` to whoever waits for the run, replace its thread; returns how many
        abandoned threads of this process are still stuck."""
        self.entry.settle(result)
        return self.line.abandon(self.thread)


def abandonable() -> Abandon | None:
    """From inside a run on a run thread: how to abandon it should it get stuck; None where
    runs are not on run threads (a prefork child: the pool ends it)."""
    line, entry = getattr(_local, "line", None), getattr(_local, "current", None)
    if line is None or entry is None:
        return None
    return Abandon(line, entry, threading.current_thread())


def run_all(fn: Callable[[T, Any], R], items: Sequence[T]) -> list[R]:
    """``fn(item, taken)`` for each item as this process runs keys; results in order. Every
    item runs even when an earlier one raised; the first exception is raised at the end."""
    entries = [Waiting(item, fn) for item in items]
    line = _line
    if line is None or threading.current_thread() is threading.main_thread():
        rest = collections.deque(entries)
        _local.next = lambda: rest.popleft() if rest else None
        try:
            with deadlines.everywhere():
                while rest:
                    entry: Waiting | None = rest.popleft()
                    while entry is not None:
                        entry = _run_taking(entry)
        finally:
            _local.next = None
    else:
        line.put(entries)
    outcomes = []
    for entry in entries:
        error = entry.future.exception()
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt, SystemExit: not one key's failure
        outcomes.append((None if error else entry.future.result(), error))
    for _, error in outcomes:
        if error is not None:
            raise error
    return [result for result, _ in outcomes]  # type: ignore[misc]
