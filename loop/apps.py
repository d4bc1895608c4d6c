from __future__ import annotations

from django.apps import AppConfig


class LoopConfig(AppConfig):
    name = "loop"
    verbose_name = "Pippa Loop"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed
        from django.db.models.signals import post_migrate
        from django.utils.module_loading import autodiscover_modules

        from . import installation, tools
        from .mcp import catalog
        from .web.pages import login

        tools.load_builtin()
        autodiscover_modules("tools")
        catalog.load()
        user_login_failed.connect(login.count_failure, dispatch_uid="loop.throttle.login")
        user_logged_in.connect(login.clear_on_success, dispatch_uid="loop.throttle.login_ok")
        post_migrate.connect(installation.after_migrate, sender=self, dispatch_uid="loop.install")
