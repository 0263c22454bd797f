"""Replay a recorded run: the current code of its reconciler against exactly what it read.

A run keeps its inputs (``RunInputs``: the object as read, every ``ctx.get`` / ``ctx.list``
with its answer, and the writes it made) when ``RECONCILERS_RECORD_INPUTS`` says so - by
default for failed runs. ``replay(record_id)`` (``manage.py replay <id>``, the admin's
*Replay* button) runs the reconciler's current code on those inputs through the runner's own
attempt (``call.attempt``: the same read of the object, call, exception capture, status
write and decision as a worker's run): reads are answered from the record, and writes are
captured, never sent - nothing reaches the api-server or the cache. The outcome and writes
come back beside the recorded run's, to see what a fix changes.
``reconcilers.testing.replay_inputs`` runs the same on inputs a test keeps, and
``regression_test`` writes such a test from a record.

A read the replayed code makes that the recorded run did not (the fix reads something new)
is answered as "not found" and listed in ``Replayed.unrecorded``; a write answers with the
object as the write makes it (a POST's body, a PATCH merged into what was read).
"""

from __future__ import annotations

import copy
import json
import logging
import pprint
from dataclasses import dataclass, field
from typing import Any

from reconcilers._kube import kube
from reconcilers._run import call
from reconcilers._run.inputs import writes_of
from reconcilers._base.conf import settings
from reconcilers._kube.lister import Lister
from reconcilers.models import ReconcileRecord, RunInputs
from reconcilers._authoring.registry import ReconcilerRegistry, registry as default_registry
from reconcilers._base.reconcile import Key

log = logging.getLogger(__name__)

@dataclass
class Replayed:
    """A replay's outcome and writes, beside the recorded run's."""

    record_id: int
    outcome: str
    error: str
    writes: list[dict]
    recorded_outcome: str
    recorded_error: str
    recorded_writes: list[dict]
    unrecorded: list[str] = field(default_factory=list)  # reads the record could not answer

    def report(self) -> str:
        """Both runs, side by side, as the command prints them."""
        lines = [f"run #{self.record_id}: recorded {self.recorded_outcome}, replayed "
                 f"{self.outcome}"]
        if self.recorded_error:
            lines.append(f"  recorded error: {self.recorded_error.splitlines()[0][:300]}")
        if self.error:
            lines.append(f"  replay error:   {self.error.splitlines()[0][:300]}")
        for title, writes in (("recorded writes", self.recorded_writes),
                              ("replay writes (not sent)", self.writes)):
            lines.append(f"  {title}: {len(writes)}")
            lines += [f"    {w['method']} {w['path']}" for w in writes]
        if self.unrecorded:
            lines.append("  reads the record could not answer (answered as not found): "
                         + ", ".join(self.unrecorded))
        return "\n".join(lines)


class NotReplayable(LookupError):
    """A run without kept inputs, or whose reconciler is no longer registered."""


def replay(record_id: int, registry: ReconcilerRegistry | None = None) -> Replayed:
    """Run the current code of record ``record_id``'s reconciler on its kept inputs."""
    record = ReconcileRecord.objects.filter(pk=record_id).first()
    inputs = RunInputs.objects.filter(record_id=record_id).first()
    if record is None or inputs is None:
        raise NotReplayable(f"run #{record_id} kept no inputs (RECONCILERS_RECORD_INPUTS="
                            f"{settings().record_inputs}; inputs are pruned with history)")
    run = replay_inputs({"reconciler": record.reconciler, "namespace": record.namespace,
                         "name": record.name, "attempt": record.attempt,
                         "triggers": inputs.triggers, "obj": inputs.obj, "reads": inputs.reads},
                        registry)
    return Replayed(record_id, run.outcome, run.error, run.writes, record.outcome,
                    record.error_message, list(inputs.writes), run.unrecorded)


def inputs_of(record_id: int) -> dict:
    """A record's inputs as ``replay_inputs`` takes them (what a regression test keeps)."""
    record = ReconcileRecord.objects.get(pk=record_id)
    inputs = RunInputs.objects.get(record_id=record_id)
    return {"reconciler": record.reconciler, "namespace": record.namespace,
            "name": record.name, "attempt": record.attempt, "triggers": inputs.triggers,
            "obj": inputs.obj, "reads": inputs.reads}


@dataclass
class _Outcome:
    outcome: str
    error: str
    writes: list[dict]
    unrecorded: list[str]
    obj: dict | None


def replay_inputs(inputs: dict, registry: ReconcilerRegistry | None = None) -> _Outcome:
    """Run the current code on ``inputs`` (``inputs_of``'s shape): reads from them, writes
    captured. The run is the runner's own (``call.attempt``), on an api that answers from
    the inputs: what a worker does for a key, a replay does."""
    registry = registry or default_registry
    name = inputs["reconciler"]
    if name not in registry:
        raise NotReplayable(f"no reconciler named {name!r} is registered here")
    cls = registry.get_class(name)
    key = Key(name, inputs["namespace"], inputs["name"])
    world = _World(copy.deepcopy(inputs["obj"]),
                   cls.primary().path(key.namespace or None, key.name))
    done = call.attempt(
        key, cls, registry, attempts=max(0, int(inputs.get("attempt") or 1) - 1),
        backoff=settings().backoff(cls.backoff_base, cls.backoff_max),
        api=kube.Offline(world.answer), triggers=inputs.get("triggers") or (),
        reads=lambda live: _Recorded(live, inputs.get("reads") or [], world))
    ctx = done.ctx
    return _Outcome(done.decision.outcome, done.decision.error_message,
                    writes_of(ctx.writes) if ctx is not None else [],
                    ctx.lister.unrecorded if ctx is not None else [],
                    done.seen.final or done.seen.obj)


class _World:
    """What the replayed code sees of the api-server: the objects the run read, changed by
    its own writes; nothing leaves the process."""

    def __init__(self, obj: dict, path: str):
        self.objects: dict[str, dict] = {path: copy.deepcopy(obj)}

    def answer(self, method: str, path: str, body: Any, query: Any, content_type: str) -> Any:
        path = path.split("?", 1)[0]
        target = path[:-len("/status")] if path.endswith("/status") else path
        if method == "GET":
            if target in self.objects:
                return copy.deepcopy(self.objects[target])
            raise kube.ApiError(404, "NotFound", f"GET {path}: not in the recorded run")
        if method == "DELETE":
            self.objects.pop(target, None)
            return {"kind": "Status", "status": "Success"}
        if method == "POST":
            made = copy.deepcopy(body) if isinstance(body, dict) else {}
            meta = made.setdefault("metadata", {})
            meta.setdefault("uid", "replayed")
            meta.setdefault("resourceVersion", "0")
            self.objects[f"{path}/{meta.get('name', '')}"] = made
            return copy.deepcopy(made)
        current = copy.deepcopy(self.objects.get(target) or {})
        merged = _merge(current, body if isinstance(body, dict) else {})
        self.objects[target] = merged
        return copy.deepcopy(merged)

    def seen(self, obj: Any) -> None:
        """A read's answer is part of the world the writes change."""
        for o in obj if isinstance(obj, list) else [obj]:
            if isinstance(o, dict) and o.get("metadata", {}).get("name"):
                self.objects.setdefault(_path_of(o), copy.deepcopy(o))


def _path_of(obj: dict) -> str:
    from reconcilers._base.vocab import GVR

    meta = obj["metadata"]
    return GVR.of(obj.get("apiVersion", "v1"), obj.get("kind", "")).path(
        meta.get("namespace"), meta["name"])


def _merge(base: dict, patch: dict) -> dict:
    """A JSON merge patch (RFC 7386), which is what ctx's patches are."""
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class _Recorded(Lister):
    """Answers reads from the record, in the order the run made them (the same read asked
    again gets the next answer recorded for it, then the last one)."""

    def __init__(self, live: Lister, reads: list[dict], world: _World):
        self.__dict__.update(live.__dict__)
        self.reads = None
        self.unrecorded: list[str] = []
        self._answers: dict[str, list] = {}
        for read in reads:
            self._answers.setdefault(_read_key(read["read"], read["args"]), []).append(
                read["result"])
        self._world = world

    def _answer(self, read: str, args: list, missing: Any) -> Any:
        answers = self._answers.get(_read_key(read, args))
        if not answers:
            self.unrecorded.append(f"{read}({', '.join(str(a) for a in args if a)})")
            return missing
        result = answers.pop(0) if len(answers) > 1 else answers[0]
        self._world.seen(result)
        return copy.deepcopy(result)

    def _get(self, api_version, kind, name, namespace, plural):
        return self._answer("get", [api_version, kind, name, namespace, plural], None)

    def _list(self, api_version, kind, namespace, labels, index, plural):
        return self._answer("list", [api_version, kind, namespace,
                                     dict(labels) if labels else None,
                                     list(index) if index else None, plural], [])


def _read_key(read: str, args: list) -> str:
    return json.dumps([read, args], sort_keys=True, default=str)


def regression_test(record_id: int) -> str:
    """A pytest module that replays this record's inputs and asserts the run now succeeds:
    the failure, kept as a test after the fix."""
    inputs = inputs_of(record_id)
    slug = "".join(c if c.isalnum() else "_" for c in f"{inputs['name']}_{record_id}")
    return (
        f'"""Regression test from run #{record_id} of {inputs["reconciler"]} '
        f'({inputs["namespace"]}/{inputs["name"]}): written by `manage.py replay --as-test`."""\n\n'
        "from reconcilers.testing import replay_inputs\n\n"
        f"INPUTS = {pprint.pformat(inputs, indent=4, sort_dicts=True)}\n\n\n"
        f"def test_run_{slug}_now_succeeds():\n"
        "    run = replay_inputs(INPUTS)\n"
        "    assert run.outcome == \"success\", run.error\n")
