"""The dashboard: per reconciler, reconciles per minute by outcome over the last hour (a
server-rendered SVG, no JavaScript, no CDN), error rate, p50/p99 duration, queue states,
oldest queued age, and the retention settings in force."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.core.exceptions import PermissionDenied
from django.db import connection
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from reconcilers._base.conf import settings
from ..models import ReconcileRecord, WorkItem
from reconcilers._base.reconcile import Outcome
from .common import OUTCOME_COLOURS

MINUTES = 60
ORDER = [Outcome.SUCCESS, Outcome.REQUEUE_AFTER, Outcome.REQUEUE, Outcome.SKIPPED,
         Outcome.GONE, Outcome.ERROR, Outcome.PERMANENT]


def per_minute(since) -> dict[str, dict[int, dict[str, int]]]:
    """``{reconciler: {minute_index: {outcome: count}}}``, minute 0 the oldest."""
    table = ReconcileRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT reconciler, floor(extract(epoch FROM started_at - %s) / 60)::int, "
            f"outcome, count(*) FROM {table} WHERE started_at >= %s GROUP BY 1, 2, 3",
            [since, since])
        rows = cursor.fetchall()
    out: dict = defaultdict(lambda: defaultdict(dict))
    for reconciler, minute, outcome, n in rows:
        out[reconciler][min(max(minute, 0), MINUTES - 1)][outcome] = n
    return out


def durations(since) -> dict[str, tuple[float, float, int, int]]:
    """``{reconciler: (p50 ms, p99 ms, runs, failed runs)}`` over the window."""
    table = ReconcileRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT reconciler, percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms), "
            f"percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms), count(*), "
            f"count(*) FILTER (WHERE outcome IN ('error', 'permanent')) "
            f"FROM {table} WHERE started_at >= %s GROUP BY 1", [since])
        return {r: (p50, p99, n, failed) for r, p50, p99, n, failed in cursor.fetchall()}


def queues() -> dict[str, dict]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT reconciler, state, count(*), min(enqueued_at) FILTER (WHERE state='queued') "
            f"FROM {WorkItem._meta.db_table} GROUP BY 1, 2")
        rows = cursor.fetchall()
    out: dict = defaultdict(lambda: {"idle": 0, "queued": 0, "running": 0, "backoff": 0,
                                     "oldest": None})
    for reconciler, state, n, oldest in rows:
        out[reconciler][state] = n
        if oldest is not None:
            out[reconciler]["oldest"] = oldest
    return out


def chart_svg(minutes: dict[int, dict[str, int]], width: int = 720, height: int = 140) -> str:
    """Stacked bars, one per minute, coloured by outcome; the y axis scales to the busiest."""
    peak = max([sum(m.values()) for m in minutes.values()] or [0]) or 1
    bar = width / MINUTES
    rects = []
    for i in range(MINUTES):
        y = height
        for outcome in ORDER:
            n = minutes.get(i, {}).get(outcome, 0)
            if not n:
                continue
            h = n / peak * (height - 20)
            y -= h
            rects.append((f"{i * bar:.1f}", f"{y:.1f}", f"{bar - 1:.1f}", f"{h:.1f}",
                          OUTCOME_COLOURS[outcome], f"{MINUTES - i} min ago: {n} {outcome}"))
    body = format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                                "<title>{}</title></rect>", rects)
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" role="img" '
        'aria-label="reconciles per minute"><text x="2" y="12" font-size="11">peak {}/min'
        '</text><line x1="0" y1="{}" x2="{}" y2="{}" stroke="#999"/>{}</svg>',
        width, height, peak, height, width, height, body)


def legend() -> str:
    return format_html_join(" ", '<span style="color:{}">&#9632; {}</span>',
                            ((OUTCOME_COLOURS[o], o) for o in ORDER))


def dashboard_view(admin_site):
    def view(request):
        if not request.user.has_perm("reconcilers.view_reconcilerecord"):
            raise PermissionDenied
        now = timezone.now()
        since = now - timedelta(minutes=MINUTES)
        charts, stats, queue = per_minute(since), durations(since), queues()
        from reconcilers._authoring.registry import registry

        names = sorted(set(registry.names()) | set(charts) | set(queue))
        rows = []
        for name in names:
            p50, p99, runs, failed = stats.get(name, (None, None, 0, 0))
            q = queue[name]
            rows.append({
                "name": name, "chart": chart_svg(charts.get(name, {})), "runs": runs,
                "error_rate": f"{failed / runs:.1%}" if runs else "-",
                "p50": f"{p50:.1f} ms" if p50 is not None else "-",
                "p99": f"{p99:.1f} ms" if p99 is not None else "-",
                "queue": q,
                "oldest": f"{(now - q['oldest']).total_seconds():.1f} s" if q["oldest"] else "-",
            })
        conf = settings()
        context = {**admin_site.each_context(request), "title": "Operator dashboard",
                   "rows": rows, "legend": legend(), "now": now,
                   "retention": {"days": conf.history_days, "per_key": conf.history_per_key},
                   "settings": conf.table()}
        return TemplateResponse(request, "reconcilers/admin/dashboard.html", context)

    return admin_site.admin_view(view)

