from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from loop import actions, plans
from loop.management.base import LoopCommand
from loop.models import Task
from loop.permissions import SYSTEM

ADMIN = "dad"
DEMO_PLAN = """
title: Demo - say hello to the family
steps:
  - key: greet
    title: Compose a greeting
    tool: echo
    args: {value: "Hello from Pippa"}
  - key: think
    title: Take a moment
    tool: sleep
    args: {seconds: 2}
  - key: note
    title: Write the greeting to a file (asks first)
    tool: file.write
    args: {path: "demo/hello.txt", content: "${greet.value}"}
    confirm_before: true
"""


class Command(LoopCommand):
    help = (
        "First run: an admin user `dad` (its password printed once, when it is made) and a demo "
        "task. Safe to run again."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        password = ""
        if not User.objects.filter(username=ADMIN).exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser(ADMIN, f"{ADMIN}@localhost", password)
        if not Task.objects.exists():
            actions.create_task(plan=plans.parse(DEMO_PLAN), actor="bootstrap", user=SYSTEM)
        # Earlier versions kept the first password in plaintext here; it is shown no more.
        old_file = Path(settings.DATA_DIR) / "admin-login.txt"
        if old_file.exists():
            old_file.unlink()
            self.stdout.write(f"Deleted {old_file} (a password kept in plaintext).")
        if password:
            self.stdout.write(f"Log in as: {ADMIN} / password: {password}  (shown once: note it)")
        else:
            self.stdout.write(
                f"Log in as: {ADMIN} (the user exists; to set a new password: "
                f".venv/bin/python manage.py changepassword {ADMIN})"
            )
