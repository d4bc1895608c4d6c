from django.contrib import admin
from django.urls import include, path

from loop.pages.login import LoginView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", LoginView.as_view(), name="login"),  # throttled; before auth.urls
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("loop.urls")),
]
