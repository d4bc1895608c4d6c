import os
import sys

from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
try:
    django_asgi_app = get_asgi_application()
except ImproperlyConfigured as exc:
    # daphne imports this module first: a setting it can't take stops the server with one line
    # naming it (as manage.py does), not a traceback.
    sys.exit(f"settings: {exc}")

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from loop.mcp.endpoint import Endpoint  # noqa: E402
from loop.web.routing import websocket_urlpatterns  # noqa: E402
from loop.web.unavailable import SocketUnavailable  # noqa: E402
from pippa_site.ws_origin import SameOriginOnly  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /mcp: Pippa Loop's MCP server behind agent tokens (loop/mcp/endpoint.py)
        "http": Endpoint(django_asgi_app),
        "websocket": SameOriginOnly(
            AllowedHostsOriginValidator(
                # The database or Redis down: the socket closes as "paused", not with 1011.
                SocketUnavailable(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
            )
        ),
    }
)
