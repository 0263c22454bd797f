"""The docs hold together: every relative link resolves, the README stays a door, and benchmark
figures appear in one place.

Pure text checks on README.md, CHANGELOG.md and docs/**/*.md; no service is needed.

**Links.** Every relative markdown link (``[text](path)``, ``[text](path#anchor)``,
``[text](#anchor)``) must name an existing file, and an ``#anchor`` into a markdown file must
name one of its headings, slugged as GitHub does: lower-cased, punctuation other than ``-``
and ``_`` dropped, each space a ``-``, a repeated heading suffixed ``-1``, ``-2``, ...
Links inside code (fenced blocks, inline backticks) are not links.

**Figures appear once.** Benchmark figures live only in the generated blocks - between
``<!-- figures:begin -->`` / ``<!-- figures:end -->`` (``bench/figures.py``) and
``<!-- bench:<mode>:start -->`` / ``<!-- bench:<mode>:end -->`` (``bench/report.py``) in
docs/contributing/benchmarks.md, and the soak's own ``<!-- soak:measured:begin -->`` section
in docs/contributing/reliability.md - and in ``bench/results/``. Everywhere else a figure is a
link to the generated block. What counts as a figure, and why settings do not:

- a ratio with a decimal point: ``0.91x``, ``1.34 x``;
- a throughput: a number followed by ``obj/s`` or ``objects/s``;
- a memory size: a number followed by ``MiB``;
- a time in milliseconds that is a measurement: a decimal (``25.0 ms``, ``0.41 ms``), a range
  (``10-19 ms``), or one following a statistic or an approximation (``p50 38 ms``,
  ``median 15 ms``, ``~60 ms``, ``about 30 ms``, ``was 238 ms``).

A whole number of milliseconds or seconds on its own is a setting or a parameter - a backoff
base ("5 ms doubling"), a harness interval ("every 100 ms"), a timeout default ("300 s" in the
configuration table, generated from ``reconcilers/conf.py``) - and is not a figure. Seconds
are never matched: every duration the docs state in seconds is a setting, a limit or a
first-run estimate.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))
CHECKED = [README, REPO / "CHANGELOG.md", *DOCS]
README_MAX_LINES = 300

GENERATED = re.compile(
    r"<!-- figures:begin -->.*?<!-- figures:end -->"
    r"|<!-- bench:(\w+):start -->.*?<!-- bench:\1:end -->"
    r"|<!-- soak:measured:begin -->.*?<!-- soak:measured:end -->", re.S)
STATISTIC = r"(?:\b(?:p50|p90|p95|p99|median|mean|average|avg|was|vs\.?|took|measured|about)|~)"
FIGURES = {
    "ratio": re.compile(r"(?<![\w.])\d+\.\d+ ?x\b"),
    "throughput": re.compile(r"\d ?(?:obj|objects)/s\b"),
    "memory": re.compile(r"(?<![\w.])\d[\d,.]* ?MiB\b"),
    "decimal ms": re.compile(r"(?<![\w.])\d+\.\d+ ?ms\b"),
    "range in ms": re.compile(r"(?<![\w.])\d+(?:\.\d+)?-\d+(?:\.\d+)? ?ms\b"),
    "measured ms": re.compile(STATISTIC + r"\s*\d+(?:\.\d+)? ?ms\b", re.I),
}
# Files whose figures another change removes: the test fails once they are gone, so the entry
# goes with them.
PENDING: dict[str, str] = {}  # a doc known to break the rule, with why: a strict xfail

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (kept line for line)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("``", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = FENCE.sub("", path.read_text())
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(prose(path.read_text()))]


@pytest.mark.parametrize("path", CHECKED, ids=rel)
def test_every_relative_link_names_an_existing_file_and_heading(path):
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not broken, f"{rel(path)}: " + "; ".join(broken)


def test_the_readme_is_a_door():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def figures_outside_generated_blocks(path: Path) -> list[str]:
    text = GENERATED.sub("", prose(path.read_text()))
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in FIGURES.items():
            for match in pattern.finditer(line):
                found.append(f"{kind} {match.group(0)!r}: {line.strip()[:100]}")
    return found


@pytest.mark.parametrize("path", CHECKED, ids=rel)
def test_benchmark_figures_appear_only_in_the_generated_blocks(path, request):
    if rel(path) in PENDING:
        request.applymarker(pytest.mark.xfail(reason=PENDING[rel(path)], strict=True))
    found = figures_outside_generated_blocks(path)
    assert not found, f"{rel(path)}: link the generated block instead of:\n" + "\n".join(found)


def test_the_figure_patterns_catch_figures_and_leave_settings_alone(tmp_path):
    doc = tmp_path / "x.md"
    for figure in ("converge 1.34x kopf", "269 obj/s", "peak RSS 197 MiB", "p50 25.0 ms",
                   "took 10-19 ms", "at p50 38 ms", "~60 ms sooner", "0.41 ms per call"):
        doc.write_text(figure + "\n")
        assert figures_outside_generated_blocks(doc), figure
    for setting in ("backoff 5 ms doubling to 1000 s", "flushed every 100 ms",
                    "| `RECONCILERS_WATCH_TIMEOUT_MIN` | `300` | seconds |", "a 50 ms reconcile",
                    "`RECONCILERS_ENQUEUE_WINDOW` (20 ms)", "v1.35.4", "a 1 Gi limit"):
        doc.write_text(setting + "\n")
        assert not figures_outside_generated_blocks(doc), setting
    doc.write_text("<!-- figures:begin -->\n| 269 obj/s | 1.34x |\n<!-- figures:end -->\n")
    assert not figures_outside_generated_blocks(doc)


def test_github_slugs():
    assert slug("What is guaranteed, and what is not") == "what-is-guaranteed-and-what-is-not"
    assert slug("The class and its `Meta`") == "the-class-and-its-meta"
    assert slug("Your first operator in 10 minutes: scaffold it") == (
        "your-first-operator-in-10-minutes-scaffold-it")
    assert slug("What deploy/ sets up for production") == "what-deploy-sets-up-for-production"
