"""What the operator remembers: registered reconcilers, the work ledger, history, watch streams.

The work ledger's state machine lives in ``ledger.py`` beside these models (each transition is a
single SQL statement); this module holds only the tables. Their words - triggers, states,
outcomes - are the run's vocabulary (``_base.reconcile``), shared with the ledger and runner.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.utils import timezone

from reconcilers._base.reconcile import Key, Outcome, State


class RegisteredReconciler(models.Model):
    """One row per reconciler registered in code, refreshed when workers or the watcher start."""

    name = models.CharField(max_length=253, unique=True, help_text="<plural>.<group>")
    group = models.CharField(max_length=253, blank=True)
    version = models.CharField(max_length=63)
    kind = models.CharField(max_length=63)
    plural = models.CharField(max_length=63)
    namespaced = models.BooleanField(default=True)
    declared_level = models.PositiveSmallIntegerField(default=1)
    owns = models.JSONField(default=list, blank=True)
    resync_period = models.FloatField(
        null=True, blank=True,
        help_text="Seconds between periodic resyncs of every object; overrides the code's "
                  "value when set (0 = never). Takes effect within a minute, no restart.")
    start_fingerprint = models.CharField(
        max_length=64, blank=True, default="",
        help_text="Fingerprint of the code and settings whose start pass (every object "
                  "reconciled by a new leader) last completed.")
    registered_at = models.DateTimeField(auto_now_add=True)
    seen_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "reconciler"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def sync_from(cls, reconcilers) -> None:
        """Record what the code registers (called when a watcher starts)."""
        for rec in reconcilers:
            gvr = rec.primary()
            cls.objects.update_or_create(name=rec.name(), defaults={
                "group": gvr.group, "version": gvr.version, "kind": gvr.kind,
                "plural": gvr.plural, "namespaced": gvr.namespaced,
                "declared_level": rec.capability_level,
                "owns": [{"apiVersion": o.api_version, "kind": o.kind} for o in rec.owns],
            })


class WorkItem(models.Model):
    """The durable WorkQueue: one row per object key.

    Invariants (kept by ``ledger.py``): at most one run per row at any instant (only the holder
    of the current ``token`` may move ``queued -> running``); ``dirty`` is true only while
    ``running`` and means "run again when this run ends"; ``attempts`` counts consecutive
    failures and is reset by a success (client-go's Forget).
    """

    reconciler = models.CharField(max_length=253)
    namespace = models.CharField(max_length=253, blank=True, default="")
    name = models.CharField(max_length=253)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IDLE)
    # Bumped on every transition that sends a message; a message whose token differs is stale.
    token = models.BigIntegerField(default=0)
    dirty = models.BooleanField(default=False)
    paused = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    pending_triggers = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    running_triggers = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    pending_audit = ArrayField(models.BigIntegerField(), default=list, blank=True)
    running_audit = ArrayField(models.BigIntegerField(), default=list, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # NULL while a queued item's message has not been handed to the broker (the outbox).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=255, blank=True, default="")
    last_outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["reconciler", "namespace", "name"], name="workitem_unique_key"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "due_at"], name="workitem_state_due"),
            models.Index(fields=["reconciler", "state"], name="workitem_reconciler_state"),
        ]
        permissions = [
            ("resync_workitem", "Can trigger a manual resync"),
            ("pause_workitem", "Can pause and resume reconciles"),
        ]
        verbose_name = "work item"

    def __str__(self) -> str:
        return self.key_str

    @property
    def key_str(self) -> str:
        return str(Key(self.reconciler, self.namespace, self.name))


class RecordQuerySet(models.QuerySet):
    def datetimes(self, field_name, kind, order="ASC", tzinfo=None):
        """Every year/month/day between the oldest and newest run, from MIN/MAX (two index
        lookups) instead of ``SELECT DISTINCT date_trunc(...)`` over the whole table.

        The admin's date drill-down calls this; on a million-row history the DISTINCT costs
        hundreds of milliseconds per page, and a period with no runs listed is harmless.
        """
        if kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, order, tzinfo)
        bounds = self.aggregate(first=models.Min(field_name), last=models.Max(field_name))
        if bounds["first"] is None:
            return []
        from datetime import timedelta

        from django.utils import timezone as tz

        first, last = (tz.localtime(bounds["first"]), tz.localtime(bounds["last"]))
        out, current = [], first.replace(hour=0, minute=0, second=0, microsecond=0)
        if kind in ("year", "month"):
            current = current.replace(day=1)
        if kind == "year":
            current = current.replace(month=1)
        while current <= last:
            out.append(current)
            if kind == "day":
                current = current + timedelta(days=1)
            elif kind == "month":
                current = current.replace(year=current.year + current.month // 12,
                                          month=current.month % 12 + 1)
            else:
                current = current.replace(year=current.year + 1)
        return out[::-1] if order == "DESC" else out


class ReconcileRecord(models.Model):
    """One row per reconcile run: what it saw, how it ended, where it ran."""

    objects = RecordQuerySet.as_manager()

    reconciler = models.CharField(max_length=253)
    namespace = models.CharField(max_length=253, blank=True, default="")
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True, default="")
    triggers = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    duration_ms = models.FloatField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    requeue_after = models.FloatField(
        null=True, blank=True, help_text="seconds until the next run this one asked for "
        "(retry backoff or requeue-after); empty when none")
    error_class = models.CharField(max_length=255, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    resource_version = models.CharField(max_length=64, blank=True, default="")
    generation = models.BigIntegerField(null=True, blank=True)
    worker = models.CharField(max_length=255, blank=True, default="")
    task_id = models.CharField(max_length=255, blank=True, default="")
    audit_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    events = models.JSONField(default=list, blank=True,
                              help_text="Kubernetes Events the run emitted, kept after they expire")
    conditions = models.JSONField(default=list, blank=True,
                                  help_text="status.conditions of the object when the run ended")
    capabilities = models.JSONField(
        default=list, blank=True,
        help_text="Capability actions of this run: reported with ctx.capability(action, "
                  "detail), or seen (healed: a changed or deleted child written again)")
    observed_generation = models.BigIntegerField(
        null=True, blank=True, help_text="status.observedGeneration when the run ended")
    phase = models.CharField(max_length=16, blank=True, default="",
                             help_text="reconcile or finalize (empty when nothing ran)")

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["reconciler", "namespace", "name", "started_at"],
                         name="record_key_started"),
            models.Index(fields=["started_at"], name="record_started"),
            models.Index(fields=["outcome", "started_at"], name="record_outcome_started"),
            # The admin's filters and exact-match search, each ordered by time.
            models.Index(fields=["reconciler", "started_at"], name="record_reconciler_started"),
            models.Index(fields=["namespace", "started_at"], name="record_namespace_started"),
            models.Index(fields=["name"], name="record_name"),
            models.Index(fields=["uid"], name="record_uid"),
            GinIndex(fields=["triggers"], name="record_triggers"),
        ]

    def __str__(self) -> str:
        return f"{Key(self.reconciler, self.namespace, self.name)} {self.outcome}"


class WatchStream(models.Model):
    """The Reflector's health, per watched resource: what the admin shows about each stream."""

    reconciler = models.CharField(max_length=253)
    resource = models.CharField(max_length=253, help_text="group/version/plural")
    role = models.CharField(max_length=16, default="primary")
    connected = models.BooleanField(default=False)
    holder = models.CharField(max_length=255, blank=True, default="")
    resource_version = models.CharField(max_length=64, blank=True, default="")
    last_event_at = models.DateTimeField(null=True, blank=True)
    last_list_at = models.DateTimeField(null=True, blank=True)
    events = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0, help_text="events a predicate filtered out")
    relists = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reconciler", "resource"], name="watchstream_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.reconciler} <- {self.resource}"

    @classmethod
    def record(cls, reconciler: str, resource: str, **values) -> None:
        """Write a stream's status: one UPDATE (it runs every few seconds per stream, and at a
        watcher's stop, which a restarted watcher waits for); the first time, a create."""
        if not cls.objects.filter(reconciler=reconciler, resource=resource).update(
                **values, updated_at=timezone.now()):
            cls.objects.update_or_create(reconciler=reconciler, resource=resource,
                                         defaults=values)


class AuditLogQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise TypeError("the audit log is append-only")

    def delete(self):
        raise TypeError("the audit log is append-only")


class AuditLog(models.Model):
    """Append-only record of every manual action: who, when, what, how many keys, from where."""

    class Action(models.TextChoices):
        RESYNC = "resync"
        PAUSE = "pause"
        RESUME = "resume"
        REPLAY = "replay"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                             related_name="+")
    username = models.CharField(max_length=150, help_text="kept if the user is deleted")
    action = models.CharField(max_length=16, choices=Action.choices)
    reconciler = models.CharField(max_length=253)
    keys = models.JSONField(default=list, help_text="the keys acted on (at most 1,000 listed)")
    key_count = models.PositiveIntegerField()
    ip = models.GenericIPAddressField(null=True, blank=True)
    source = models.CharField(max_length=32, default="admin")

    objects = AuditLogQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "audit log entry"
        verbose_name_plural = "audit log"

    def __str__(self) -> str:
        return f"{self.username} {self.action} {self.key_count} key(s) of {self.reconciler}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise TypeError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise TypeError("the audit log is append-only")


class WebhookCall(models.Model):
    """One admission webhook call: which object, which hook, allowed or denied and why, how
    long it took - shown per resource in the admin like reconcile runs."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    resource = models.CharField(max_length=253, help_text="<plural>.<group>")
    namespace = models.CharField(max_length=253, blank=True, default="")
    name = models.CharField(max_length=253, blank=True, default="")
    operation = models.CharField(max_length=16)
    hook = models.CharField(max_length=16, help_text="validate or mutate")
    allowed = models.BooleanField()
    message = models.TextField(blank=True, default="")
    dry_run = models.BooleanField(default=False)
    duration_ms = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["resource", "at"], name="webhookcall_resource_at")]
        verbose_name = "webhook call"

    def __str__(self) -> str:
        verdict = "allowed" if self.allowed else "denied"
        return f"{self.hook} {self.operation} {self.resource} {self.name}: {verdict}"


class CapabilityEvidence(models.Model):
    """The first run that proved an observable capability criterion, per reconciler.

    Written by the runner when a run proves a criterion (see ``evidence.py``), so the
    admin reads one small table instead of searching a million-row history.
    """

    reconciler = models.CharField(max_length=253)
    criterion = models.CharField(max_length=64)
    record_id = models.BigIntegerField(help_text="the proving run (it may since be pruned)")
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["reconciler", "criterion"],
                                               name="evidence_unique")]
        verbose_name_plural = "capability evidence"


class CapabilityLevel(models.Model):
    """The five Operator SDK capability levels and their criteria (seeded by a migration).

    ``criteria`` is a list of ``{"id", "text", "observed"}``; ``observed`` criteria are scored
    from the ledger and history by ``evidence.py``, the others are the operator's claim.
    """

    level = models.PositiveSmallIntegerField(primary_key=True)
    name = models.CharField(max_length=64)
    summary = models.TextField()
    criteria = models.JSONField(default=list)

    class Meta:
        ordering = ["level"]

    def __str__(self) -> str:
        return f"{self.level}. {self.name}"


class Timer(models.Model):
    """When each object's timer fires next (``timers``): one row per object and timer."""

    reconciler = models.CharField(max_length=253)
    namespace = models.CharField(max_length=253, blank=True, default="")
    name = models.CharField(max_length=253)
    timer = models.CharField(max_length=26)
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["reconciler", "namespace", "name", "timer"],
                                               name="timer_unique_key")]
        indexes = [models.Index(fields=["reconciler", "due_at"], name="timer_reconciler_due")]

    def __str__(self) -> str:
        return f"{self.reconciler}:{self.namespace}/{self.name} {self.timer}"


class RunInputs(models.Model):
    """What one run read - the object and every read through ``ctx`` - and the writes it made:
    enough to run the current code against exactly those inputs (``replay``). Kept for the
    runs ``RECONCILERS_RECORD_INPUTS`` says, pruned with their history rows."""

    record_id = models.BigIntegerField(unique=True, help_text="the ReconcileRecord's id")
    obj = models.JSONField(help_text="the object as the run read it")
    reads = models.JSONField(default=list, blank=True,
                             help_text="every ctx.get/ctx.list, its arguments and its answer")
    writes = models.JSONField(default=list, blank=True,
                              help_text="the writes the run made: method, path, body")
    triggers = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    size = models.PositiveIntegerField(default=0, help_text="bytes, as stored")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "run inputs"
        verbose_name_plural = "run inputs"

    def __str__(self) -> str:
        return f"inputs of run #{self.record_id}"
