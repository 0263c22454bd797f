"""Comments and docstrings in ``reconcilers/`` state the rule and why, never a measurement's
history: no before/after timings, no medians, no change or issue numbers. Those belong in the
benchmark results (``bench/results/``) and the commit log, where they stay true; in the code
they go stale the day something else changes.

A setting's default or a peer's behaviour ("5 ms doubling", "kopf waits 0.1 s") is a rule, not
a measurement, and passes."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "reconcilers"

DURATION = r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|µs|us|s)\b"
MEASUREMENT = [
    re.compile(rf"\b(?:took|takes|cost|costs|costing|saves?|saved|was|were|before|median|"
               rf"p50|p90|p99|average|mean)\b[^.;\n]{{0,12}}?{DURATION}", re.I),
    re.compile(rf"{DURATION}[^.;\n]{{0,12}}\b(?:before|faster|slower|less|more than before)\b",
               re.I),
    re.compile(r"\b\d+(?:\.\d+)? ?x (?:kopf|controller-runtime|cr-matched|faster|slower)\b",
               re.I),
    re.compile(r"\b(?:change|issue) #?\d+\b", re.I),
]


def offending(source: str) -> list[str]:
    """Comment and docstring lines of ``source`` that cite a measurement or a change number."""
    texts: list[tuple[int, str]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            texts.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""',
                                                                                   "'''")):
            previous = next((t for t in reversed(tokens[:i])
                             if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                               tokenize.DEDENT)), None)
            if previous is None or previous.string in (":",) or previous.type == tokenize.STRING:
                for n, line in enumerate(tok.string.splitlines()):
                    texts.append((tok.start[0] + n, line))
            elif previous.type in (tokenize.NEWLINE, tokenize.NL):
                texts.append((tok.start[0], tok.string))
    found = []
    for line, text in texts:
        if any(p.search(text) for p in MEASUREMENT):
            found.append(f"{line}: {text.strip()}")
    return found


def _sources() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py")
                  if "migrations" not in p.parts and "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(APP.parent)))
def test_comments_state_rules_not_measurements(path: Path):
    found = offending(path.read_text())
    assert not found, "state the rule and why; keep figures in bench/results:\n" + "\n".join(
        found)


@pytest.mark.parametrize("text", [
    "# the interpreter's teardown took 0.25-0.35 s, time a restart waits for nothing",
    "# median 0.53 s, 0.60 s before",
    "# (change 31) batch the enqueue",
    '"""Claims in one statement: 3.1 ms before, 1.2 ms after."""',
    "# 1.3x kopf on the converge scenario",
])
def test_a_measurement_in_a_comment_is_caught(text: str):
    assert offending(f"x = 1\n{text}\n" if text.startswith("#") else f"def f():\n    {text}\n")


@pytest.mark.parametrize("text", [
    "# per-key retry backoff (default 5 ms -> 1000 s, client-go's)",
    "# A dropped connection is retried almost at once (kopf waits 0.1 s)",
    "# flushes counters of a quiet stream (throttled to every 5 s)",
    '"""Keys due together share messages, each keeping its own id."""',
])
def test_a_rule_in_a_comment_passes(text: str):
    assert not offending(f"x = 1\n{text}\n" if text.startswith("#") else f"def f():\n    {text}\n")
