"""A stream's index sets in the real Redis: what ``ctx.list(index=...)`` finds is what the
``Index`` functions said, a malformed object never stops the filing, and a rebuild starts from
nothing."""

from __future__ import annotations

import logging

from reconcilers._kube import cache
from reconcilers._base.vocab import GVR, Index
from reconcilers._watch.indexer import Indexer

CONFIGMAPS = GVR.of("v1", "ConfigMap")
# Raises (KeyError) for a ConfigMap without data.color: a malformed object, to this index.
STRICT_COLOR = Index("v1", "ConfigMap", "color", lambda cm: [cm["data"]["color"]])
NAMESPACE = "indexed"


def _cm(name: str, color: str | None = None) -> tuple[str, dict]:
    data = {"color": color} if color else {}
    return f"{NAMESPACE}/{name}", {"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"namespace": NAMESPACE, "name": name},
                                   "data": data}


def _synced() -> None:
    """The scope listed, as a reflector's list leaves it: ``cache.indexed`` answers only then."""
    pipe = cache.get_redis().pipeline(transaction=True)
    cache.mark_synced(CONFIGMAPS, NAMESPACE, "1", "test", pipe)
    pipe.execute()


def _filed(color: str) -> set[str] | None:
    return cache.indexed(CONFIGMAPS, NAMESPACE, "color", color)


def test_an_index_function_that_raises_files_that_object_under_nothing_and_goes_on(
        redis_client, caplog):
    indexer = Indexer(CONFIGMAPS, NAMESPACE, {"color": STRICT_COLOR})
    red, plain, blue = _cm("red", "red"), _cm("plain"), _cm("blue", "blue")
    pipe = cache.get_redis().pipeline(transaction=True)
    with caplog.at_level(logging.ERROR, logger="reconcilers._watch.indexer"):
        indexer.rebuild(dict([red, plain, blue]), pipe)
    pipe.execute()
    _synced()

    assert _filed("red") == {red[0]} and _filed("blue") == {blue[0]}
    assert indexer.values(plain[1]) == {"color": set()}
    assert "index 'color' failed on plain" in caplog.text


def test_a_change_moves_the_object_from_its_old_values_to_its_new_ones(redis_client):
    indexer = Indexer(CONFIGMAPS, NAMESPACE, {"color": STRICT_COLOR})
    (path, red), (_, blue) = _cm("one", "red"), _cm("one", "blue")
    pipe = cache.get_redis().pipeline(transaction=True)
    indexer.rebuild({path: red}, pipe)
    indexer.refile(path, red, blue, pipe)
    pipe.execute()
    _synced()
    assert (_filed("red"), _filed("blue")) == (set(), {path})

    pipe = cache.get_redis().pipeline(transaction=True)
    indexer.refile(path, blue, None, pipe)  # deleted
    pipe.execute()
    assert _filed("blue") == set()


def test_a_rebuild_forgets_what_no_listed_object_is_filed_under(redis_client):
    """After a list the sets are made again, not patched: an entry the list no longer
    supports (left by a watcher with another index function, or by a change this stream never
    saw) is gone."""
    indexer = Indexer(CONFIGMAPS, NAMESPACE, {"color": STRICT_COLOR})
    (path, red), (_, blue) = _cm("one", "red"), _cm("one", "blue")
    pipe = cache.get_redis().pipeline(transaction=True)
    indexer.rebuild({path: red}, pipe)
    pipe.execute()

    pipe = cache.get_redis().pipeline(transaction=True)
    indexer.rebuild({path: blue}, pipe)  # the object changed while no stream watched it
    pipe.execute()
    _synced()
    assert (_filed("red"), _filed("blue")) == (set(), {path})
