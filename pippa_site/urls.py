from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from loop.api.site import urlpatterns as api_urls
from loop.web.pages.login import LoginView

# Refused before any view runs (a Host not allowed): JSON under /api/, as every API answer.
handler400 = "loop.api.site.bad_request"
# The database unavailable outside a view (a session saved on the way out): 503, not 500.
handler500 = "loop.web.unavailable.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for it on every page (the admin's too); a 404 there is an error in the console.
    path("favicon.ico", RedirectView.as_view(url=static("loop/favicon.svg"), permanent=True)),
    path("accounts/login/", LoginView.as_view(), name="login"),  # throttled; before auth.urls
    path("accounts/", include("django.contrib.auth.urls")),
    # The HTTP API (loop/api/, django-ninja): token auth, JSON, no trailing slashes.
    *api_urls(),
    path("", include("loop.urls")),
]
