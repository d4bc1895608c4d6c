from django.urls import path

from . import views

app_name = "loop"
urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
]
