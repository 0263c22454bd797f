"""Seed the five Operator SDK capability levels with their criteria."""

from django.db import migrations

from reconcilers._base.capability_levels import as_rows


def seed(apps, schema_editor):
    CapabilityLevel = apps.get_model("reconcilers", "CapabilityLevel")
    for row in as_rows():
        CapabilityLevel.objects.update_or_create(level=row["level"], defaults=row)


def unseed(apps, schema_editor):
    apps.get_model("reconcilers", "CapabilityLevel").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("reconcilers", "0004_admin_audit_capabilities")]

    operations = [migrations.RunPython(seed, unseed)]
