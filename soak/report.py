"""What the soak says about itself: why a process exited, and the measured section of
docs/contributing/reliability.md, written from the run's own report (``python -m soak
--write-docs``) so the figures there are always those of a run on the code they name."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

BEGIN, END = "<!-- soak:measured:begin -->", "<!-- soak:measured:end -->"

# What a process's last log lines say about why it exited on its own, and what that means.
EXPLANATIONS = [
    ("draining worker process", "a thread-pool worker drained and exited with too many "
     "abandoned runs still stuck (by design; restarted as its supervisor would)"),
    ("ignored its run deadline", "a worker ended at a run's hard limit (by design; restarted "
     "as its supervisor would)"),
    ("stalled worker process", "a worker whose consumer stayed stalled ended itself (by "
     "design, for supervisors that restart only what exits; restarted as they would)"),
]


def explain_exit(code: int, log: Path) -> str | None:
    """Why a process exited on its own, from the end of its log; None when nothing says."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    found = [(tail.rfind(needle), why) for needle, why in EXPLANATIONS if needle in tail]
    return max(found)[1] if found else None


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10,
                               cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _verdict(value) -> str:
    return {True: "passed", False: "**FAILED**", None: "**not run**"}[value]


def section(result: dict) -> str:
    """The measured section, in Markdown, from a report (``python -m soak --report``)."""
    audit = result.get("audit log") or {}
    command = (f"python -m soak --minutes {result['minutes']:g} --objects "
               f"{result.get('objects requested', result['objects'])} --seed {result['seed']} "
               f"--each-fault --faults {result.get('fault mode', 'all')} --pool {result['pool']}")
    lines = [
        f"### Measured (`{command}`)", "",
        f"Written by the run itself (`--write-docs`) on {result.get('date', '?')}, the code "
        f"of `{result.get('commit', '?')}`; {result['seconds']} s in all, everything (control "
        f"plane, PostgreSQL, Redis, the operator) sharing this machine. Overall: "
        f"**{'passed' if result['passed'] else 'FAILED'}**. The full report is in "
        f"[soak-report.json](soak-report.json).", "",
        "| fault or change injected | count |", "| --- | --- |",
        f"| objects changed (spec.value, spec.children) | {result['changes']} |",
        *[f"| {kind} | {n} |" for kind, n in sorted(result["faults"].items())], "",
        "| what the checkers saw | value |", "| --- | --- |",
        f"| objects | {result['objects']} in {result['namespaces']} namespaces |",
        f"| runs of one key overlapping in the api-server's audit log (each run's begin to "
        f"its end) | "
        + (f"**{result['audit overlaps']}** ({audit.get('writes', 0)} writes, "
           f"{audit.get('runs seen', 0)} runs, {audit.get('runs with a begin and an end', 0)} "
           f"with a begin and an end, {audit.get('writes answered 429', 0)} writes answered "
           f"429, {audit.get('writes answered 5xx', 0)} answered 5xx)" if audit.get("ran")
           else f"not checked: {audit.get('why not', '?')}") + " |",
        f"| changes by the soak no run saw (audit log: none followed by a run that began "
        f"after it and ended) | "
        + (f"**{result.get('changes lost')}** of {audit.get('changes by the soak', 0)}"
           if audit.get("ran") else "not checked") + " |",
        f"| writes to the soak's objects outside a run (audit log) | "
        + (f"{len(audit.get('writes outside any run', []))}" if audit.get("ran")
           else "not checked") + " |",
        f"| faults with no effect seen (silent) | "
        f"**{len(result.get('silent faults', []))}** of {result.get('faults injected', 0)} |",
        f"| objects not converged / keys left unsettled | **{len(result['unconverged'])}** |",
        f"| messages published (or tried) / received by workers / never delivered | "
        f"{result.get('messages published', 0)} / "
        f"{result.get('messages received by workers', 0)} / "
        f"{result.get('messages the broker never delivered', 0)} |",
        f"| keys lost (an undelivered message's key never run after it) | "
        f"**{result.get('lost', 0)}** |",
        f"| runs recorded in the history / seen in the side channel | "
        f"{result['runs recorded']} / {result['runs in the side channel']} |",
        f"| overlapping runs in the side channel / in the history (secondary) | "
        f"{result['overlaps'] - (result.get('audit overlaps') or 0)} / "
        f"{result.get('history overlaps', 0)} |",
        f"| runs lost to killed workers (recorded by the reaper) | "
        f"{result['runs lost to killed workers (recorded by the reaper)']} |",
        f"| largest broker backlog | {result['max broker backlog']} messages |",
        f"| settled after the faults stopped / took a last change to every object | "
        f"{result['settled in (s)']} s / {result.get('took the last change in (s)', '?')} s |",
        "",
        "Process exits on their own, each with what its log says (restarted as a supervisor "
        "would):", "",
        *([f"- {e}" for e in result.get("process exits", [])] or ["- none"]), "",
        "Workers restarted because their liveness probe failed (a consumer that stopped "
        "consuming: Celery's Redis consumer after a broker reset, the soak acting as the "
        "kubelet):", "",
        *([f"- {e}" for e in result.get(
            "Celery workers restarted by their liveness probe (consumer stalled)", [])]
          or ["- none"]), "",
        *[f"- {_verdict(v)}: {name}" for name, v in result["checks"].items()],
        *[f"- {_verdict(v)}: {name} (secondary: the operator's own tables)"
          for name, v in result.get("secondary checks", {}).items()],
        *([] if not result.get("silent faults") else
          ["", "Faults with no effect seen:", "", *[f"- {f}" for f in result["silent faults"]]]),
    ]
    return "\n".join(lines) + "\n"


def write_docs(result: dict, doc: Path) -> None:
    """Replace the text between the measured-section markers of ``doc`` and write the report
    beside it."""
    result = {**result, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    text = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers")
    text = pattern.sub(lambda _m: f"{BEGIN}\n{section(result)}{END}", text)
    doc.write_text(text)
    (doc.parent / "soak-report.json").write_text(json.dumps(result, indent=2) + "\n")
