"""Watch streams, the audit log, webhook calls and the capability levels: read-only pages."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html_join

from ..models import AuditLog, CapabilityLevel, WatchStream, WebhookCall
from .common import ReadOnlyAdmin


@admin.register(WatchStream)
class WatchStreamAdmin(ReadOnlyAdmin):
    list_display = ("reconciler", "resource", "role", "connected_col", "last_event_at",
                    "events", "skipped", "relists", "errors", "last_error", "holder",
                    "updated_at")
    list_filter = ("connected", "reconciler", "role")

    @admin.display(description="connected", boolean=True, ordering="connected")
    def connected_col(self, s: WatchStream) -> bool:
        return s.connected


@admin.register(WebhookCall)
class WebhookCallAdmin(ReadOnlyAdmin):
    list_display = ("at", "resource", "namespace", "name", "hook", "operation", "allowed",
                    "message", "duration_ms", "dry_run")
    list_filter = ("resource", "hook", "allowed", "operation")
    search_fields = ("=name", "=namespace")
    date_hierarchy = "at"


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "username", "action", "reconciler", "key_count", "ip",
                    "source")
    list_filter = ("action", "reconciler", "source")
    search_fields = ("=username",)
    date_hierarchy = "created_at"
    readonly_fields = ("created_at", "username", "action", "reconciler", "key_count", "ip",
                       "source", "keys")
    fields = readonly_fields


@admin.register(CapabilityLevel)
class CapabilityLevelAdmin(ReadOnlyAdmin):
    list_display = ("level", "name", "summary", "criteria_col")

    @admin.display(description="criteria (observed ones are scored from history)")
    def criteria_col(self, level: CapabilityLevel) -> str:
        return format_html_join("", "<div>{} {}</div>", (
            ("[observed]" if c.get("evidence") else "[claimed]", c["text"])
            for c in level.criteria))
