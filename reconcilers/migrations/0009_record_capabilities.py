"""Runs keep the capability actions they reported or showed; the capability levels are
re-seeded with criteria a person would accept, and evidence recorded under the old, looser
auto-healing rule (any successful owned-child run) is dropped."""

from django.db import migrations, models

from reconcilers._base.capability_levels import as_rows


def reseed(apps, schema_editor):
    CapabilityLevel = apps.get_model("reconcilers", "CapabilityLevel")
    for row in as_rows():
        CapabilityLevel.objects.update_or_create(level=row["level"], defaults=row)
    apps.get_model("reconcilers", "CapabilityEvidence").objects.filter(
        criterion="auto_healing").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("reconcilers", "0008_watchstream_skipped"),
    ]

    operations = [
        migrations.AddField(
            model_name="reconcilerecord",
            name="capabilities",
            field=models.JSONField(blank=True, default=list, help_text="Capability actions of this run: reported with ctx.capability(action, detail), or seen (healed: a changed or deleted child written again)"),
        ),
        migrations.RunPython(reseed, migrations.RunPython.noop),
    ]
