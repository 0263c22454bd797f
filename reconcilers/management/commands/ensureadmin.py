"""Create or update the first admin user from the environment (idempotent).

``DJANGO_SUPERUSER_USERNAME`` (default ``admin``), ``DJANGO_SUPERUSER_PASSWORD`` (required),
``DJANGO_SUPERUSER_EMAIL`` (optional). Used by ``make demo`` and the compose ``migrate`` service.
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
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"{'created' if created else 'updated'} admin user {username!r}")
