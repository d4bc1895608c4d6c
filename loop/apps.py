from __future__ import annotations

from django.apps import AppConfig


class LoopConfig(AppConfig):
    name = "loop"
    verbose_name = "Pippa Loop"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import tools

        tools.load_builtin()
        autodiscover_modules("tools")
