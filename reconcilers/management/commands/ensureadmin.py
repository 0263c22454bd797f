"""Create the first admin user from the environment, or set its password (idempotent).

``DJANGO_SUPERUSER_USERNAME`` (default ``admin``), ``DJANGO_SUPERUSER_PASSWORD`` (required),
``DJANGO_SUPERUSER_EMAIL`` (optional). Used by ``make demo``, the compose ``migrate`` service
and the migrate Job, so it runs after every migrate: an existing user keeps the active, staff
and superuser flags staff gave it - a disabled or demoted admin is never enabled again.
"""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def handle(self, *args, **options) -> None:
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if not password:
            raise CommandError("DJANGO_SUPERUSER_PASSWORD is not set")
        model = get_user_model()
        user = model.objects.filter(username=username).first()
        created = user is None
        if created:
            user = model(username=username, email=os.environ.get("DJANGO_SUPERUSER_EMAIL", ""))
        try:
            validate_password(password, user)  # AUTH_PASSWORD_VALIDATORS, as the admin's form
        except ValidationError as exc:
            raise CommandError("DJANGO_SUPERUSER_PASSWORD is refused: "
                               + " ".join(exc.messages)) from None
        if created:
            user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"{'created' if created else 'updated'} admin user {username!r}")
        if not (user.is_active and user.is_staff and user.is_superuser):
            self.stdout.write(f"{username!r} left disabled or without admin rights, as staff "
                              "set it: enable it in the admin or with `manage.py shell`")
