"""The checker's secondary channels (``soak.check``), on synthetic input: the side channel of
run starts and writes (two runs of one key at once), and the broker's message log (a message
never delivered is lost work only when its key never ran after)."""

from __future__ import annotations

from soak import check


def test_the_checker_sees_overlapping_runs_in_the_side_channel(tmp_path):
    trace = tmp_path / "trace.log"
    trace.write_text("start k a 10.0\nwrite k a 11.0\nstart k b 10.5\nwrite k b 10.6\n"
                     "start j c 10.0\nwrite j c 11.0\nstart j d 11.5\nwrite j d 12.0\n"
                     "start j e 20.0\nwrite j e")  # a line torn by kill -9
    runs, overlaps = check.side_channel_overlaps(trace)
    assert runs == 5
    assert len(overlaps) == 1 and overlaps[0].startswith("k: runs a")


def test_a_run_stopped_past_its_lease_that_writes_nothing_after_is_no_overlap(tmp_path):
    trace = tmp_path / "trace.log"
    # Run a starts, writes, is stopped; b runs meanwhile; a resumes but is fenced: no write.
    trace.write_text("start k a 1.0\nwrite k a 1.5\nstart k b 9.0\nwrite k b 9.5\n")
    assert check.side_channel_overlaps(trace)[1] == []


def test_a_message_the_broker_never_delivered_is_lost_only_if_its_key_never_ran_after(tmp_path):
    messages, trace = tmp_path / "messages.log", tmp_path / "trace.log"
    messages.write_text(
        "publish t1 100.0 soakitem:ns/a\nreceive t1 100.2\n"  # delivered
        "publish t2 110.0 soakitem:ns/b soakitem:ns/c\n"  # lost by the broker: b ran after
        "publish t3 120.0 soakitem:ns/d\n"  # lost, and d never ran after: lost work
        "publish t4 130.0 soakitem:ns/gone\n"  # lost, but its object was deleted
        "publish t5 140.0 soakitem:ns/e\npublish t5 150.0 soakitem:ns/e\nreceive t5 150.1\n"
        "receive t5 150.2\npublish t6")  # torn
    trace.write_text("start soakitem:ns/b r1 111.0\nstart soakitem:ns/c r2 109.0\n"
                     "start soakitem:ns/d r3 100.0\nstart soakitem:ns/e r4 151.0\n")
    figures, undelivered = check.messages(messages)
    assert figures["messages published"] == 6
    assert sorted(t for t, _at, _keys in undelivered) == ["t2", "t3", "t4"]
    lost = check.lost_keys(undelivered, trace, {"ns/a", "ns/b", "ns/c", "ns/d", "ns/e"})
    assert len(lost) == 1 and lost[0].startswith("soakitem:ns/d")
