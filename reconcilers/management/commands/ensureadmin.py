"""Create or update the first admin user from the environment (idempotent).

``DJANGO_SUPERUSER_USERNAME`` (default ``admin``), ``DJANGO_SUPERUSER_PASSWORD`` (required),
``DJANGO_SUPERUSER_EMAIL`` (optional). Used by ``make demo`` and the compose ``migrate`` service.
"""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def handle(self, *args, **options) -> None:
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if not password:
            raise CommandError("DJANGO_SUPERUSER_PASSWORD is not set")
        user, created = get_user_model().objects.get_or_create(
            username=username,
            defaults={"email": os.environ.get("DJANGO_SUPERUSER_EMAIL", "")},
        )
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"{'created' if created else 'updated'} admin user {username!r}")
