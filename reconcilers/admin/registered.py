"""Reconcilers: kinds, capability levels with their evidence, queue counts, resync forms."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, IntegerField, Max, OuterRef, Subquery
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from reconcilers._kube import cache
from reconcilers._run import evidence
from reconcilers._queue import manual, resync
from reconcilers._authoring import validation
from reconcilers._base.reconcile import Key, Outcome, State
from ..models import RegisteredReconciler, WorkItem
from reconcilers._authoring.registry import NotRegistered, registry
from .common import client_ip, metrics_link
from .workitems import RESYNC_PERM, require


def _count(**filters) -> Subquery:
    return Subquery(
        WorkItem.objects.filter(reconciler=OuterRef("name"), **filters)
        .order_by().values("reconciler").annotate(n=Count("id")).values("n"),
        output_field=IntegerField())


@admin.register(RegisteredReconciler)
class RegisteredReconcilerAdmin(admin.ModelAdmin):
    change_list_template = "reconcilers/admin/registered_change_list.html"
    list_display = ("name", "gvk", "declared_level", "evidenced", "objects_known", "queued",
                    "running", "backoff", "failing", "last_success", "resync_period")
    actions = ("resync_all",)
    fields = ("name", "gvk", "namespaced", "owns", "declared_level", "resync_period",
              "effective_resync", "metrics", "capability_evidence", "registered_at", "seen_at")
    readonly_fields = ("name", "gvk", "namespaced", "owns", "declared_level",
                       "effective_resync", "metrics", "capability_evidence", "registered_at",
                       "seen_at")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        # One query for the whole list: counts per state as correlated subqueries.
        return super().get_queryset(request).annotate(
            n_queued=_count(state=State.QUEUED), n_running=_count(state=State.RUNNING),
            n_backoff=_count(state=State.BACKOFF),
            n_failing=_count(last_outcome__in=[Outcome.ERROR, Outcome.PERMANENT]),
            last_ok=Subquery(WorkItem.objects.filter(reconciler=OuterRef("name"))
                             .order_by().values("reconciler")
                             .annotate(m=Max("last_success_at")).values("m")),
        )

    def get_actions(self, request):
        actions = super().get_actions(request)
        if request.method != "POST" and not request.user.has_perm(RESYNC_PERM):
            actions.pop("resync_all", None)
        return actions

    @admin.action(description="Resync all objects of this reconciler")
    def resync_all(self, request, queryset):
        require(request, RESYNC_PERM)
        total = 0
        for rec in queryset:
            try:
                keys = resync.known_keys(rec.name)
            except NotRegistered:
                self.message_user(request, f"{rec.name} is not registered in this process.",
                                  messages.ERROR)
                continue
            manual.resync(request.user, keys, ip=client_ip(request))
            total += len(keys)
        self.message_user(request, f"{total} key(s) enqueued for a manual resync.",
                          messages.SUCCESS)

    @admin.display(description="group/version/kind")
    def gvk(self, r: RegisteredReconciler) -> str:
        return f"{r.group or 'core'}/{r.version}/{r.kind}"

    @admin.display(description="evidenced level")
    def evidenced(self, r: RegisteredReconciler) -> str:
        return str(evidence.evidenced_level(evidence.score(r.name)))

    @admin.display(description="objects known")
    def objects_known(self, r: RegisteredReconciler) -> str:
        try:
            return str(len(cache.fields(registry.get_class(r.name).primary())))
        except Exception:
            return "?"

    @admin.display(description="queued", ordering="n_queued")
    def queued(self, r) -> int:
        return r.n_queued or 0

    @admin.display(description="running", ordering="n_running")
    def running(self, r) -> int:
        return r.n_running or 0

    @admin.display(description="in backoff", ordering="n_backoff")
    def backoff(self, r) -> int:
        return r.n_backoff or 0

    @admin.display(description="failing", ordering="n_failing")
    def failing(self, r) -> int:
        return r.n_failing or 0

    @admin.display(description="last success", ordering="last_ok")
    def last_success(self, r):
        return r.last_ok or "-"

    @admin.display(description="resync period in effect")
    def effective_resync(self, r: RegisteredReconciler) -> str:
        try:
            period = resync.period_of(r.name)
        except NotRegistered:
            return "-"
        return "never" if period <= 0 else f"every {period:g} s"

    @admin.display(description="metrics")
    def metrics(self, r: RegisteredReconciler) -> str:
        return metrics_link(r.name)

    @admin.display(description="capability levels: evidence")
    def capability_evidence(self, r: RegisteredReconciler) -> str:
        rows = []
        for level in evidence.score(r.name):
            rows.append((level.level, level.name, format_html("<strong>{}</strong>",
                                                              level.why), ""))
            for c in level.criteria:
                if c.met:
                    url = reverse("admin:reconcilers_reconcilerecord_change", args=[c.record_id])
                    mark = format_html('<a href="{}">{}</a>', url, c.why)
                else:
                    mark = c.why
                rows.append(("", "", c.text, mark))
        return format_html(
            "<table><tr><th>level</th><th></th><th>criterion</th><th>why</th></tr>{}"
            "</table>", format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td>"
                                             "<td>{}</td></tr>", rows))

    def get_urls(self):
        from .dashboard import dashboard_view

        return [path("resync-object/", self.admin_site.admin_view(self.resync_object_view),
                     name="reconcilers_resync_object"),
                path("dashboard/", dashboard_view(self.admin_site),
                     name="reconcilers_dashboard")] + super().get_urls()

    def resync_object_view(self, request):
        """Resync one object by namespace and name; bad input enqueues nothing."""
        require(request, RESYNC_PERM)
        form = ResyncObjectForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            key = Key(form.cleaned_data["reconciler"], form.cleaned_data["namespace"],
                      form.cleaned_data["name"])
            (audit,) = manual.resync(request.user, [key], ip=client_ip(request))
            self.message_user(request, f"{key} enqueued for a manual resync (audit #{audit.pk}).",
                              messages.SUCCESS)
            return HttpResponseRedirect(request.path)
        context = {**self.admin_site.each_context(request), "form": form,
                   "title": "Resync one object", "opts": self.model._meta}
        return TemplateResponse(request, "reconcilers/admin/resync_form.html", context)


class ResyncObjectForm(forms.Form):
    reconciler = forms.ChoiceField(choices=())
    namespace = forms.CharField(required=False, max_length=63)
    name = forms.CharField(max_length=253)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reconciler"].choices = [(n, n) for n in registry.names()]

    def clean(self):
        data = super().clean()
        name = data.get("reconciler")
        if name and name in registry:
            try:
                validation.check_object_ref(registry.get_class(name),
                                            data.get("namespace") or "", data.get("name"))
            except ValueError as e:
                raise forms.ValidationError(str(e)) from None
        return data
