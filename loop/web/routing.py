from __future__ import annotations

from typing import Any

from django.urls import path

from .consumers import LiveConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/live", LiveConsumer.as_asgi()),
]
