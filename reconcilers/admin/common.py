"""Pieces the admin pages share: links, filters, a paginator that does not count 1M rows."""

from __future__ import annotations

from urllib.parse import quote

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import urlencode

from reconcilers._base.conf import process_setting
from reconcilers._base.reconcile import Outcome, Trigger

OUTCOME_COLOURS = {
    Outcome.SUCCESS: "#2e7d32", Outcome.REQUEUE: "#6d4c41", Outcome.REQUEUE_AFTER: "#00838f",
    Outcome.ERROR: "#c62828", Outcome.PERMANENT: "#6a1b9a", Outcome.GONE: "#757575",
    Outcome.SKIPPED: "#9e9e9e",
}


def timeline_url(reconciler: str, namespace: str, name: str) -> str:
    return reverse("admin:reconcilers_timeline") + "?" + urlencode(
        {"reconciler": reconciler, "namespace": namespace, "name": name})


def timeline_link(reconciler: str, namespace: str, name: str, text: str | None = None) -> str:
    label = text or (f"{namespace}/{name}" if namespace else name)
    return format_html('<a href="{}">{}</a>', timeline_url(reconciler, namespace, name), label)


def _external_link(setting: str, query: str, **fields: str) -> str:
    """A link built from the URL template in ``setting`` (``{query}`` and ``fields`` filled
    in, URL-quoted), or - with no template - the query itself to paste into Prometheus or the
    log search. A broken template says so instead of breaking the page."""
    template = process_setting(setting, "")
    if not template:
        return format_html("<code>{}</code><br><small>set {} to make this a link</small>",
                           query, setting)
    try:
        url = template.format(query=quote(query, safe=""),
                              **{k: quote(str(v), safe="") for k, v in fields.items()})
    except (KeyError, IndexError, ValueError) as exc:
        return format_html("<code>{}</code><br><small>{} is not a usable template: {}</small>",
                           query, setting, exc)
    return format_html('<a href="{}" rel="noopener" target="_blank">{}</a>', url, query)


def metrics_link(reconciler: str) -> str:
    """This reconciler's reconcile rate by result, in Prometheus (``OPERATOR_METRICS_URL``)."""
    query = (f'sum by (result) (rate(controller_runtime_reconcile_total'
             f'{{controller="{reconciler}"}}[5m]))')
    return _external_link("OPERATOR_METRICS_URL", query, reconciler=reconciler)


def logs_link(reconciler: str, namespace: str, name: str, task_id: str,
              record_id: int) -> str:
    """The log lines of one run (``OPERATOR_LOGS_URL``): they carry its task id (JSON logs)."""
    query = f'task_id="{task_id}"'
    return _external_link("OPERATOR_LOGS_URL", query, reconciler=reconciler,
                          namespace=namespace, name=name, task_id=task_id,
                          record_id=str(record_id))


def outcome_badge(outcome: str) -> str:
    return format_html('<span style="color:{};font-weight:bold">{}</span>',
                       OUTCOME_COLOURS.get(outcome, "#000"), outcome or "-")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Pages that show what the operator recorded: people read them, never edit them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class EstimatedCountPaginator(Paginator):
    """Unfiltered, a table's size comes from PostgreSQL's statistics, not ``COUNT(*)``;
    filtered, the count stops at ``COUNT_CAP`` rows.

    Counting a million-row history on every changelist load costs more than the page itself;
    "page N of about M" is enough, and nobody pages past the first few thousand matches of a
    filter - they narrow it.
    """

    COUNT_CAP = 10_000

    @cached_property
    def count(self) -> int:
        query = self.object_list.query
        if not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s",
                               [self.object_list.model._meta.db_table])
                row = cursor.fetchone()
            if row and row[0] and row[0] > self.COUNT_CAP:
                return int(row[0])
        return self.object_list.order_by()[:self.COUNT_CAP].count()


class TriggerFilter(admin.SimpleListFilter):
    title = "trigger"
    parameter_name = "trigger"

    def lookups(self, request, model_admin):
        return Trigger.choices

    def queryset(self, request, queryset):
        if self.value() in Trigger.values:
            return queryset.filter(triggers__contains=[self.value()])
        return queryset


class ReconcilerFilter(admin.SimpleListFilter):
    """Registered reconcilers, from code: no ``SELECT DISTINCT`` over the history table."""

    title = "reconciler"
    parameter_name = "reconciler"

    def lookups(self, request, model_admin):
        from reconcilers._authoring.registry import registry

        return [(n, n) for n in registry.names()]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(reconciler=self.value())
        return queryset


class NamespaceFilter(admin.SimpleListFilter):
    """Namespaces from the ledger (one row per object), not ``DISTINCT`` over all history."""

    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request, model_admin):
        from ..models import WorkItem

        names = (WorkItem.objects.order_by("namespace").values_list("namespace", flat=True)
                 .distinct()[:200])
        return [(n, n or "(cluster-scoped)") for n in names]

    def queryset(self, request, queryset):
        if self.value() is not None:
            return queryset.filter(namespace=self.value())
        return queryset


def client_ip(request) -> str | None:
    """The client's address as Django sees it (set SECURE_PROXY_SSL_HEADER / a proxy-aware
    middleware in front of it to trust forwarded addresses)."""
    return request.META.get("REMOTE_ADDR")
