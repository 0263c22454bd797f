"""``reconcilers._base.once``: what a process makes once, for every thread and across a fork."""

from __future__ import annotations

import os
import signal
import threading

from reconcilers._base.once import per_process


def test_a_child_forked_while_another_thread_is_making_one_makes_its_own():
    """A prefork worker forks its children from a process with threads; one of them may be
    making a client at that moment. The child must not wait for that thread, which it has not
    got."""
    making, finish = threading.Event(), threading.Event()

    @per_process
    def make(name: str) -> object:
        if name == "slow":
            making.set()
            finish.wait(10)
        return object()

    maker = threading.Thread(target=make, args=("slow",))
    maker.start()
    assert making.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the lock was held when it was forked
        signal.alarm(5)  # a deadlock ends the child with SIGALRM
        made = make("other") is make("other")
        os._exit(0 if made else 1)
    finish.set()
    maker.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert make("slow") is make("slow")
