#!/usr/bin/env python
"""Django's command-line utility for Pippa Loop."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting it can't take (pippa_site/settings.py names it and what it must be): one
        # line for the operator, not a traceback through Django's import machinery.
        sys.exit(f"settings: {exc}")
