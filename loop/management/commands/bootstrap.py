from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from loop import actions, plans
from loop.management.base import LoopCommand
from loop.models import Task

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
    help = "First run: an admin user (login printed) and a demo task. Safe to run again."

    def handle(self, *args: Any, **options: Any) -> None:
        login_file = Path(settings.DATA_DIR) / "admin-login.txt"
        User = get_user_model()
        if not User.objects.filter(username="dad").exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("dad", "dad@localhost", password)
            login_file.write_text(f"dad {password}\n")
            login_file.chmod(0o600)
        if not Task.objects.exists():
            actions.create_task(plan=plans.parse(DEMO_PLAN), actor="bootstrap")
        if login_file.exists():
            user, password = login_file.read_text().split()
            self.stdout.write(f"Log in as: {user} / password: {password}")
        else:
            self.stdout.write("Log in as: dad (password set earlier; see manage.py changepassword)")
