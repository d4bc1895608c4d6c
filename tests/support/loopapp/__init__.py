"""A test-only app that adds tools. Child `manage.py` processes install it through
PIPPA_EXTRA_APPS (see tests/conftest.py `process_env`); the pytest process imports its tools."""
