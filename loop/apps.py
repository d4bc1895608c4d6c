from __future__ import annotations

from django.apps import AppConfig


class LoopConfig(AppConfig):
    name = "loop"
    verbose_name = "Pippa Loop"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed
        from django.utils.module_loading import autodiscover_modules

        from . import tools
        from .web.pages import login

        tools.load_builtin()
        autodiscover_modules("tools")
        user_login_failed.connect(login.count_failure, dispatch_uid="loop.throttle.login")
        user_logged_in.connect(login.clear_on_success, dispatch_uid="loop.throttle.login_ok")
