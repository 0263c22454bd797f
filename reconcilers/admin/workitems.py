"""The work ledger in the admin: state of every key, and the manual actions on it."""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from reconcilers._kube import cache
from reconcilers._queue import manual
from reconcilers._base.reconcile import Key, State
from ..models import AuditLog, ReconcileRecord, WorkItem
from reconcilers._authoring.registry import NotRegistered, registry
from .common import (ReadOnlyAdmin, ReconcilerFilter, client_ip, outcome_badge,
                     timeline_link)

RESYNC_PERM = "reconcilers.resync_workitem"
PAUSE_PERM = "reconcilers.pause_workitem"


def require(request, perm: str) -> None:
    """Checked on the server for every POST: a hidden button is not a permission check."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"you need the {perm!r} permission")


def keys_of(queryset) -> list[Key]:
    return [Key(*row) for row in queryset.values_list("reconciler", "namespace", "name")]


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyAdmin):
    list_display = ("object", "reconciler", "state_col", "attempts", "due_at", "waiting",
                    "last_outcome_col", "last_error_short", "last_success_at")
    list_filter = ("state", ReconcilerFilter, "paused", "last_outcome")
    search_fields = ("=name", "=namespace")
    ordering = ("reconciler", "namespace", "name")
    actions = ("resync_selected", "pause_selected", "resume_selected")
    list_per_page = 100
    readonly_fields = [f.name for f in WorkItem._meta.fields] + ["object", "current_object"]

    def get_actions(self, request):
        """Offer only what the user may do; on POST keep all, so a forged one gets a 403."""
        actions = super().get_actions(request)
        if request.method == "POST":
            return actions
        if not request.user.has_perm(RESYNC_PERM):
            actions.pop("resync_selected", None)
        if not request.user.has_perm(PAUSE_PERM):
            actions.pop("pause_selected", None)
            actions.pop("resume_selected", None)
        return actions

    @admin.action(description="Resync selected (through the ledger)")
    def resync_selected(self, request, queryset):
        require(request, RESYNC_PERM)
        keys = keys_of(queryset)
        manual.resync(request.user, keys, ip=client_ip(request))
        self.message_user(request, f"{len(keys)} key(s) enqueued for a manual resync.",
                          messages.SUCCESS)

    @admin.action(description="Pause selected (no reconcile until resumed)")
    def pause_selected(self, request, queryset):
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume selected")
    def resume_selected(self, request, queryset):
        self._set_paused(request, queryset, False)

    def _set_paused(self, request, queryset, paused: bool) -> None:
        require(request, PAUSE_PERM)
        keys = keys_of(queryset)
        manual.set_paused(request.user, keys, paused, ip=client_ip(request))
        self.message_user(request, f"{len(keys)} key(s) {'paused' if paused else 'resumed'}.",
                          messages.WARNING if paused else messages.SUCCESS)

    @admin.display(description="object", ordering="name")
    def object(self, w: WorkItem) -> str:
        return timeline_link(w.reconciler, w.namespace, w.name)

    @admin.display(description="state", ordering="state")
    def state_col(self, w: WorkItem) -> str:
        if w.paused:
            return format_html('<b style="color:#e65100">PAUSED</b> ({})', w.state)
        return w.state

    @admin.display(description="queued / running for")
    def waiting(self, w: WorkItem) -> str:
        since = {State.QUEUED: w.enqueued_at, State.RUNNING: w.started_at}.get(w.state)
        if since is None:
            return "-"
        return f"{(timezone.now() - since).total_seconds():.1f} s"

    @admin.display(description="last outcome", ordering="last_outcome")
    def last_outcome_col(self, w: WorkItem) -> str:
        return outcome_badge(w.last_outcome)

    @admin.display(description="last error")
    def last_error_short(self, w: WorkItem) -> str:
        return (w.last_error[:120] + "...") if len(w.last_error) > 120 else (w.last_error or "-")

    @admin.display(description="current object (from the cache, redacted)")
    def current_object(self, w: WorkItem) -> str:
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>",
                           current_object_json(w.reconciler, w.namespace, w.name))

    def get_urls(self):
        return [path("timeline/", self.admin_site.admin_view(self.timeline_view),
                     name="reconcilers_timeline")] + super().get_urls()

    def timeline_view(self, request):
        """One key's story in time order: runs, errors, manual actions, condition changes."""
        if not (request.user.has_perm("reconcilers.view_reconcilerecord")
                or request.user.has_perm("reconcilers.view_workitem")):
            raise PermissionDenied
        key = Key(request.GET.get("reconciler", ""), request.GET.get("namespace", ""),
                  request.GET.get("name", ""))
        context = {**self.admin_site.each_context(request), "key": key,
                   "title": f"Timeline of {key}", "entries": timeline(key),
                   "item": WorkItem.objects.filter(reconciler=key.reconciler,
                                                   namespace=key.namespace,
                                                   name=key.name).first(),
                   "object_json": current_object_json(*key)}
        return TemplateResponse(request, "reconcilers/admin/timeline.html", context)


def current_object_json(reconciler: str, namespace: str, name: str) -> str:
    """The cached object, as stored: no Secret data, no managedFields, no last-applied."""
    try:
        gvr = registry.get_class(reconciler).primary()
        obj = cache.get(gvr, namespace or None, name)
    except (NotRegistered, Exception):  # Redis down must not break the admin page
        obj = None
    return json.dumps(obj, indent=2, sort_keys=True) if obj else "(not in the cache)"


def timeline(key: Key, limit: int = 200) -> list[dict]:
    records = list(ReconcileRecord.objects.filter(
        reconciler=key.reconciler, namespace=key.namespace, name=key.name,
    ).order_by("-started_at")[:limit])[::-1]
    entries = [{"at": r.started_at, "kind": "run", "record": r} for r in records]
    previous: dict[str, str] = {}
    for r in records:
        for c in r.conditions or []:
            status = f"{c.get('status')} ({c.get('reason')})"
            if previous.get(c.get("type")) != status:
                entries.append({"at": r.finished_at, "kind": "condition",
                                "text": f"{c.get('type')} -> {status}: {c.get('message', '')}"})
                previous[c.get("type")] = status
    for a in AuditLog.objects.filter(reconciler=key.reconciler,
                                     keys__contains=[str(key)])[:limit]:
        entries.append({"at": a.created_at, "kind": "manual", "audit": a})
    return sorted(entries, key=lambda e: e["at"])
