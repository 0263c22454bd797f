"""What a run keeps of its inputs - the object as read, every read through ``ctx`` and its
answer, the writes it made - for ``replay``: by default only failed runs
(``RECONCILERS_RECORD_INPUTS``), bounded in size, pruned with history, and never a Secret's
data (``redaction``): they are stored, shown and written into tests meant for a repository."""

from __future__ import annotations

import json
import logging
from typing import Any

from reconcilers._base.conf import settings
from reconcilers._run.redaction import Redaction
from reconcilers.models import RunInputs
from reconcilers._base.reconcile import Outcome

log = logging.getLogger(__name__)


def recording() -> bool:
    """Whether runs note their inputs at all (copies of what they read)."""
    return settings().record_inputs.strip().lower() != "off"


FAILED = (Outcome.ERROR, Outcome.PERMANENT)


def wanted(outcome: str) -> bool:
    """Whether a run that ended so keeps its inputs (``RECONCILERS_RECORD_INPUTS``)."""
    mode = settings().record_inputs.strip().lower()
    return mode == "all" or (mode == "failed" and outcome in FAILED)


def keep(record_id: int, obj: Any, reads: list[dict], writes: list, triggers: list[str]
         ) -> bool:
    """Store a run's inputs, redacted; False (and nothing stored) past
    ``RECONCILERS_RECORD_INPUTS_MAX_KB`` or when they are not JSON."""
    redaction = Redaction.configured()
    try:
        document = json.dumps({"obj": redaction.object(obj),
                               "reads": [redaction.read(r) for r in reads],
                               "writes": [redaction.write(w) for w in writes_of(writes)]},
                              separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        log.warning("run #%s: inputs not kept (%s)", record_id, exc)
        return False
    if len(document) > settings().record_inputs_max_kb * 1024:
        log.info("run #%s: inputs not kept: %d KiB, over RECONCILERS_RECORD_INPUTS_MAX_KB",
                 record_id, len(document) // 1024)
        return False
    parsed = json.loads(document)
    RunInputs.objects.update_or_create(record_id=record_id, defaults={
        "obj": parsed["obj"], "reads": parsed["reads"], "writes": parsed["writes"],
        "triggers": list(triggers), "size": len(document)})
    return True


def writes_of(writes: list) -> list[dict]:
    return [{"method": m, "path": p, "body": b} for m, p, b in writes]
