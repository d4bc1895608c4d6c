"""The login pages (ours and the admin's), throttled: while the account from this browser (its
device cookie) or, without one, from this address, or this address, is over its limit of failed
logins (loop/throttle.py), the form refuses before the password is checked — the right one too —
and says how long to wait; ours answers 429. A login on ours gives the browser its device
cookie, so no one else's guesses lock it out."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import HttpRequest, HttpResponse

from ... import throttle


def refuse_while_locked(request: HttpRequest | None, username: str) -> None:
    seconds = throttle.wait(throttle.login_limits(request, username))
    if seconds:
        raise ValidationError(
            f"Too many failed logins: try again in {throttle.in_words(seconds)}.",
            code="throttled",
            params={"seconds": seconds},
        )


class LoginForm(AuthenticationForm):
    def clean(self) -> dict[str, Any]:
        refuse_while_locked(self.request, str(self.data.get("username", "")))
        return super().clean()


class AdminLoginForm(AdminAuthenticationForm):
    def clean(self) -> dict[str, Any]:
        refuse_while_locked(self.request, str(self.data.get("username", "")))
        return super().clean()


class LoginView(auth_views.LoginView):
    form_class = LoginForm

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        # This browser is the account's own now: guesses from elsewhere never lock it out.
        throttle.remember_device(self.request, response, form.get_user().get_username())
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.has_error(NON_FIELD_ERRORS, "throttled"):
            seconds = throttle.wait(
                throttle.login_limits(self.request, str(form.data.get("username", "")))
            )
            response.status_code = 429
            response["Retry-After"] = str(max(seconds, 1))
        return response


def count_failure(sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any) -> None:
    """`user_login_failed`: every failed authenticate(), whichever page asked."""
    throttle.failed(throttle.login_limits(request, str(credentials.get("username", ""))))


def clear_on_success(sender: Any, request: Any, user: Any, **_: Any) -> None:
    """`user_logged_in`: a person who mistyped and then got in starts afresh from this browser
    or address (the address's own count stays)."""
    throttle.forget(throttle.login_limits(request, user.get_username())[:1])
