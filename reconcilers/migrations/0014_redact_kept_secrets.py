"""Redact the Secrets in run inputs kept before inputs were redacted as they are stored: no
Secret value stays at rest after the upgrade (``reconcilers._run.redaction``)."""

from django.db import migrations


def redact_kept_inputs(apps, schema_editor):
    from reconcilers._run.redaction import Redaction

    RunInputs = apps.get_model("reconcilers", "RunInputs")
    redaction = Redaction.configured()
    for row in RunInputs.objects.iterator(chunk_size=500):
        obj = redaction.object(row.obj)
        reads = [redaction.read(r) for r in row.reads]
        writes = [redaction.write(w) for w in row.writes]
        if (obj, reads, writes) != (row.obj, row.reads, row.writes):
            RunInputs.objects.filter(pk=row.pk).update(obj=obj, reads=reads, writes=writes)


class Migration(migrations.Migration):

    dependencies = [
        ('reconcilers', '0013_run_inputs'),
    ]

    operations = [
        migrations.RunPython(redact_kept_inputs, migrations.RunPython.noop, elidable=True),
    ]
