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

This module only provides the threads, the line and the deadlines' scope; the run loop is the
runner's (``runner.work``). Each thread hands it a ``Lane``: the loop may take up the next
waiting key itself (``Lane.take``) - the runner then ends one run and claims the next in one
statement, as client-go's worker calls ``Done`` and then ``Get`` - and goes on with it
(``Lane.next_up``).

A run thread stuck past its run's hard limit is abandoned (``Lane.abandoner``): the run's
outcome is handed to whoever waits for it, a new thread takes its place in the line, and the
stuck one ends when - if ever - its run returns.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, Generic, Sequence, TypeVar

from reconcilers._run import deadlines

T = TypeVar("T")

NOTHING = object()  # ``Waiting.handed`` when the run that took it up handed nothing on


class Waiting(Generic[T]):
    """A key waiting for a run thread, and the future its message's task waits on.
    ``handed``: what the run that took it up (``Lane.take``) hands on to it - the runner's
    claim - or ``NOTHING``."""

    __slots__ = ("item", "fn", "future", "handed")

    def __init__(self, item: T, fn: Callable[[Waiting[T], Lane], None]) -> None:
        self.item, self.fn, self.future = item, fn, Future()
        self.handed: Any = NOTHING

    def settle(self, result: Any = None, exception: BaseException | None = None) -> bool:
        """Hand the outcome to whoever waits, unless an abandonment (or a run that raised
        after it settled) already did."""
        try:
            if exception is not None:
                self.future.set_exception(exception)
            else:
                self.future.set_result(result)
            return True
        except InvalidStateError:
            return False


class Lane:
    """One run thread's (or the main thread's) place in the line, handed to the run loop it
    runs: the loop takes up the next waiting key itself (``take``) and goes on with it
    (``next_up``), as client-go's worker calls ``Done`` then ``Get``. Passed, never kept
    per thread: a lane belongs to one call of the loop."""

    def __init__(self, current: Waiting, pop: Callable[[Callable], Waiting | None],
                 line: _Line | None = None) -> None:
        self.current: Waiting | None = current
        self.taken: Waiting | None = None
        self._pop, self._line = pop, line
        self._thread = threading.current_thread()

    def take(self) -> Waiting | None:
        """The key this thread runs next, out of the line now - so no other thread runs it -
        or ``None`` (nothing waits that this loop runs, or it already took one). Set its
        ``handed`` before ``next_up``."""
        if self.taken is not None or self.current is None:
            return None
        self.taken = self._pop(self.current.fn)
        return self.taken

    def next_up(self) -> Waiting | None:
        """The key taken, now the current one; ``None`` when none was - or when this thread
        was abandoned meanwhile, its successor taking its place: the key goes back to the
        front of the line, with what was handed on to it."""
        taken, self.taken = self.taken, None
        if taken is not None and self._line is not None and self._line.replaced(
                self._thread, taken):
            taken = None
        self.current = taken
        return taken

    def abandoner(self) -> Abandon | None:
        """How to abandon the current run should it get stuck; ``None`` where runs are not on
        run threads (a prefork child, the solo pool: the pool ends it)."""
        if self._line is None or self.current is None:
            return None
        return Abandon(self._line, self.current, self._thread)

    def run(self) -> None:
        """The current entry's loop; whatever it left unsettled or taken is not lost."""
        entry = self.current
        try:
            entry.fn(entry, self)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - the waiting thread re-raises it
            if self.current is not None:
                self.current.settle(exception=exc)
        if self.taken is not None:  # taken but never run: first in line again
            self._put_back(self.taken)
            self.taken = None

    def _put_back(self, entry: Waiting) -> None:
        if self._line is not None:
            self._line.put_back(entry)
        else:
            self._pop.put_back(entry)  # type: ignore[attr-defined]


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

    def replaced(self, thread: threading.Thread, taken: Waiting) -> bool:
        """Whether ``thread`` was abandoned; if so ``taken`` goes back to the front."""
        with self.ready:
            if thread not in self.abandoned:
                return False
            self.waiting.appendleft(taken)
            self.ready.notify()
            return True

    def put(self, entries: Sequence[Waiting]) -> None:
        with self.ready:
            self.waiting.extend(entries)
            self.ready.notify(len(entries))

    def put_back(self, entry: Waiting) -> None:
        with self.ready:
            self.waiting.appendleft(entry)
            self.ready.notify()

    def pop(self, fn: Callable) -> Waiting | None:
        """The first waiting entry if ``fn`` runs it, else ``None``."""
        with self.ready:
            if self.waiting and self.waiting[0].fn is fn:
                return self.waiting.popleft()
            return None

    def stop(self) -> None:
        with self.ready:
            self.stopped = True
            self.ready.notify_all()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self.ready:
                while not self.waiting and not self.stopped:
                    self.ready.wait()
                if self.stopped and not self.waiting:
                    return
                entry = self.waiting.popleft()
            Lane(entry, self.pop, self).run()
            with self.ready:
                if me in self.abandoned:  # replaced while stuck: its successor works on
                    self.abandoned.discard(me)
                    return


class _Rest:
    """A message's keys in the main thread, one after another (``run_all``)."""

    def __init__(self, entries: Sequence[Waiting]) -> None:
        self.entries = collections.deque(entries)

    def __call__(self, fn: Callable) -> Waiting | None:
        if self.entries and self.entries[0].fn is fn:
            return self.entries.popleft()
        return None

    def put_back(self, entry: Waiting) -> None:
        self.entries.appendleft(entry)


# The process's run threads and their line: set by ``configure`` (the worker's start, from
# Celery's ``worker_ready``; tests), under ``_lock``; read by every thread that runs keys.
# Module level because a process has one pool of run threads, whatever calls it.
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


class Abandon:
    """What abandoning a run thread takes, captured on that thread."""

    def __init__(self, line: _Line, entry: Waiting, thread: threading.Thread) -> None:
        self.line, self.entry, self.thread = line, entry, thread

    def __call__(self, result: Any) -> int:
        """Hand ``result`` to whoever waits for the run, replace its thread; returns how many
        abandoned threads of this process are still stuck."""
        self.entry.settle(result)
        return self.line.abandon(self.thread)


def run_all(loop: Callable[[Waiting[T], Lane], None], items: Sequence[T]) -> list[Any]:
    """Run each item as this process runs keys; results in order. ``loop(entry, lane)`` is
    the run loop: it settles ``entry`` and every entry it goes on with (``Lane``). Every item
    runs even when an earlier one raised; the first exception is raised at the end."""
    entries = [Waiting(item, loop) for item in items]
    line = _line
    if line is None or threading.current_thread() is threading.main_thread():
        rest = _Rest(entries)
        with deadlines.everywhere():
            while rest.entries:
                Lane(rest.entries.popleft(), rest).run()
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
    return [result for result, _ in outcomes]
