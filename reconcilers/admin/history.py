"""Reconcile history: read-only, filterable, fast on large tables."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from reconcilers._run import replay
from ..models import AuditLog, ReconcileRecord
from reconcilers._base.reconcile import Key
from .common import (EstimatedCountPaginator, NamespaceFilter, ReadOnlyAdmin, ReconcilerFilter,
                     TriggerFilter, logs_link, outcome_badge, timeline_link)


@admin.register(ReconcileRecord)
class ReconcileRecordAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "object", "reconciler", "outcome_col", "triggers_col",
                    "attempt", "duration", "generation", "worker")
    list_filter = ("outcome", ReconcilerFilter, TriggerFilter, NamespaceFilter)
    date_hierarchy = "started_at"
    # Exact matches use the indexes; a substring search would scan every row.
    search_fields = ("=name", "=namespace", "=uid")
    search_help_text = "Exact object name, namespace or uid."
    ordering = ("-started_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter option over all history
    list_per_page = 50
    actions = ("replay_selected",)
    fields = ("object", "reconciler", "outcome_col", "triggers_col", "attempt", "phase",
              "started_at", "finished_at", "duration", "requeue_after", "resource_version",
              "generation", "observed_generation", "uid", "worker", "task_id", "logs",
              "error_class",
              "error_message", "traceback_col", "events_col", "conditions_col", "capabilities_col",
              "audit_col")
    readonly_fields = fields

    def get_actions(self, request):
        """Replay runs the reconciler's code here: only for who may trigger runs (on POST
        all are kept, so a forged one gets a 403)."""
        from .workitems import RESYNC_PERM

        actions = super().get_actions(request)
        if request.method != "POST" and not request.user.has_perm(RESYNC_PERM):
            actions.pop("replay_selected", None)
        return actions

    @admin.action(description="Replay with today's code (writes captured, nothing sent)")
    def replay_selected(self, request, queryset):
        from .common import client_ip
        from .workitems import RESYNC_PERM, require

        require(request, RESYNC_PERM)
        records = list(queryset[:20])
        AuditLog.objects.create(
            user=request.user, username=request.user.get_username(),
            action=AuditLog.Action.REPLAY, reconciler=records[0].reconciler if records else "",
            keys=[str(Key(r.reconciler, r.namespace, r.name)) for r in records],
            key_count=len(records), ip=client_ip(request))
        for record in records:
            try:
                report = replay.replay(record.pk).report()
                level = messages.SUCCESS
            except replay.NotReplayable as exc:
                report, level = str(exc), messages.WARNING
            self.message_user(request, format_html("<pre>{}</pre>", report), level)

    def get_search_results(self, request, queryset, search_term):
        """Exact, case-sensitive matches, so PostgreSQL uses the indexes (``=`` in
        ``search_fields`` would be ``iexact``: a scan of every row)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(name=term) | Q(namespace=term) | Q(uid=term)), False

    @admin.display(description="object", ordering="name")
    def object(self, r: ReconcileRecord) -> str:
        return timeline_link(r.reconciler, r.namespace, r.name)

    @admin.display(description="outcome", ordering="outcome")
    def outcome_col(self, r: ReconcileRecord) -> str:
        return outcome_badge(r.outcome)

    @admin.display(description="triggers")
    def triggers_col(self, r: ReconcileRecord) -> str:
        return ", ".join(r.triggers) or "-"

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, r: ReconcileRecord) -> str:
        return f"{r.duration_ms:.1f} ms"

    @admin.display(description="log lines of this run")
    def logs(self, r: ReconcileRecord) -> str:
        if not r.task_id:
            return "-"
        return logs_link(r.reconciler, r.namespace, r.name, r.task_id, r.pk)

    @admin.display(description="traceback")
    def traceback_col(self, r: ReconcileRecord) -> str:
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>", r.traceback) \
            if r.traceback else "-"

    @admin.display(description="Kubernetes Events emitted")
    def events_col(self, r: ReconcileRecord) -> str:
        if not r.events:
            return "-"
        return format_html_join("", "<div>{} <b>{}</b>: {}</div>",
                                ((e.get("type"), e.get("reason"), e.get("message"))
                                 for e in r.events))

    @admin.display(description="conditions at the end of the run")
    def conditions_col(self, r: ReconcileRecord) -> str:
        if not r.conditions:
            return "-"
        return format_html_join("", "<div>{} = <b>{}</b> ({}) {}</div>",
                                ((c.get("type"), c.get("status"), c.get("reason"),
                                  c.get("message", "")) for c in r.conditions))

    @admin.display(description="capability actions")
    def capabilities_col(self, r: ReconcileRecord) -> str:
        if not r.capabilities:
            return "-"
        return format_html_join("", "<div><b>{}</b> {}</div>",
                                ((c.get("action"), c.get("detail", "")) for c in r.capabilities))

    @admin.display(description="manual action")
    def audit_col(self, r: ReconcileRecord) -> str:
        if not r.audit_ids:
            return "-"
        return format_html_join(", ", '<a href="{}">audit #{}</a>', (
            (reverse("admin:reconcilers_auditlog_change", args=[i]), i) for i in r.audit_ids))
