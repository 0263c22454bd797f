"""Long-lived processes freeze the heap they start with, so full collections skip it."""

from __future__ import annotations

import gc

from celery import signals

from reconcilers import heap, tasks


def test_what_exists_at_the_freeze_is_out_of_the_collectors_generations():
    started_with = [[] for _ in range(10)]  # tracked containers, as modules' objects are
    try:
        heap.freeze_startup_heap()
        tracked = {id(o) for o in gc.get_objects()}  # generations 0-2: what collections walk
        assert not any(id(o) in tracked for o in started_with)
        assert gc.get_freeze_count() >= len(started_with)
        later = []
        assert any(o is later for o in gc.get_objects(generation=0))
    finally:
        gc.unfreeze()


def test_workers_freeze_once_started_and_so_does_every_prefork_child():
    tasks.install()
    for signal in (signals.worker_ready, signals.worker_process_init):
        assert heap.freeze_startup_heap in [receiver for _, receiver in signal.receivers]
