"""Two admin roles for the people who run the operator, so nobody needs superuser for it.

``Operator viewers`` read history, work items, watch streams and the audit log.
``Operator on-call`` can also trigger a manual resync and pause or resume a key.
Put a staff user in a group (admin -> Users) and they have exactly that. Running this again
leaves the groups' other permissions alone: it only adds what a role needs.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

VIEW = [
    "view_reconcilerecord",
    "view_workitem",
    "view_registeredreconciler",
    "view_watchstream",
    "view_auditlog",
    "view_capabilitylevel",
    "view_capabilityevidence",
]
ROLES = {
    "Operator viewers": VIEW,
    "Operator on-call": [*VIEW, "resync_workitem", "pause_workitem"],
}


def add_roles(apps, schema_editor):
    # Permissions are normally created after migrate (post_migrate); a fresh database has none
    # yet, so make the framework app's now.
    config = apps.get_app_config("reconcilers")
    config.models_module = True
    create_permissions(config, apps=apps, verbosity=0)
    config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        perms = Permission.objects.filter(
            content_type__app_label="reconcilers", codename__in=codenames
        )
        group.permissions.add(*perms)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("reconcilers", "0008_watchstream_skipped"),
    ]
    operations = [migrations.RunPython(add_roles, remove_roles)]
