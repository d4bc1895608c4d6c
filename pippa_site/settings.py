"""Wiring only: every knob comes from the environment, with safe embedded defaults.

Embedded default: a SQLite file (WAL, synchronous=FULL on every connection), the in-memory
channel layer, no other service. Scale-out: DATABASE_URL to PostgreSQL, REDIS_URL to Redis.
"""

from __future__ import annotations

import os
import zoneinfo
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from loop import numbers

from .private import UMASK, make_private

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_int(name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    """A whole number from the environment, in ASCII digits (`loop.numbers`), within its
    bounds; ImproperlyConfigured naming the setting otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return numbers.whole(raw, name, low=low, high=high)
    except numbers.NotANumber as exc:
        raise ImproperlyConfigured(str(exc)) from None


def env_float(name: str, default: float, *, low: float, high: float) -> float:
    """A number (a fraction allowed; no exponent, nan or inf) from the environment, within its
    bounds; ImproperlyConfigured naming the setting otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return numbers.number(raw, name, low=low, high=high)
    except numbers.NotANumber as exc:
        raise ImproperlyConfigured(str(exc)) from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


# Absolute: a relative PIPPA_DATA_DIR means where it was given, for every child process too.
DATA_DIR = Path(os.environ.get("PIPPA_DATA_DIR") or BASE_DIR / "var").absolute()
os.umask(UMASK)  # before anything is written: every file this process makes is owner-only
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    # A per-installation key kept beside the data, so restarts keep sessions valid.
    key_file = DATA_DIR / "secret_key"
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if not key_file.exists():
        import secrets

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Not "daphne": it serves the site as its own command (bin/up), and as an app it only takes
# over `runserver` while loading Twisted into every process, half a second per `manage.py`.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "template_partials",
    "loop",
    # Apps that add tools (their tools.py is autodiscovered); the tests load their recording
    # tool and a testing knob this way.
    *env_list("PIPPA_EXTRA_APPS", []),
]

MIDDLEWARE = [
    "pippa_site.csp.content_security_policy",
    "django.middleware.security.SecurityMiddleware",
    # The database unreachable or refusing writes: a 503 with the reason, never a 500.
    "loop.web.unavailable.Unavailable",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "pippa_site.form_limits.FormLimits",  # before the CSRF check reads the form
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "loop.web.zones.ActiveZone",  # times in the person's own zone (else TIME_ZONE)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "pippa_site.urls"
ASGI_APPLICATION = "pippa_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # `plain` and `who`: the loop's words said to a person (loop/web/words.py).
            "builtins": ["loop.web.words"],
        },
    },
]


def parse_database_url(url: str, setting: str, **options: Any) -> dict[str, Any]:
    """A database URL as Django's settings for it; ImproperlyConfigured naming the setting."""
    try:
        return dict(dj_database_url.parse(url, **options))
    except ValueError as exc:  # an unknown scheme, a port that is no number, …
        raise ImproperlyConfigured(f"{setting}: not a database URL ({exc})") from None


def database_from_url(url: str | None) -> dict[str, Any]:
    """SQLite by default; `sqlite:////abs/path` or `postgres://…` from DATABASE_URL."""
    if not url:
        url = f"sqlite:///{DATA_DIR / 'pippa.sqlite3'}"
    config = parse_database_url(url, "DATABASE_URL", conn_max_age=0)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # SQLite's own backend, but a writer waiting for the write lock gets its turn.
        config["ENGINE"] = "pippa_site.sqlite_turns"
        config["OPTIONS"] = {
            # Every connection: WAL so readers never block the writer, and FULL so a
            # committed intent survives a power cut (an intent a power cut can lose is no intent).
            "init_command": (
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"
            ),
            # BEGIN IMMEDIATE: a transaction takes the write lock up front, so a
            # read-then-write inside it never fails half-way on an upgrade.
            "transaction_mode": "IMMEDIATE",
            "timeout": env_int("LOOP_SQLITE_BUSY_TIMEOUT", 30, low=1),
        }
        # A SQLite connection is a file handle with nothing to go stale: keep it, instead
        # of reopening it (and re-running the PRAGMAs) for every request and every tick.
        config["CONN_MAX_AGE"] = None
        # Tests run on a file too (never in memory), beside the real one.
        name = Path(str(config["NAME"]))
        config["TEST"] = {"NAME": str(name.with_name(f"test_{name.name}"))}
    return config


DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL"))}
# Extra aliases for the sql.execute tool: LOOP_SQL_DATABASES="name=url,name2=url2".
for _pair in env_list("LOOP_SQL_DATABASES", []):
    _name, _, _url = _pair.partition("=")
    if not _url:
        raise ImproperlyConfigured(f"LOOP_SQL_DATABASES entry {_pair!r} must be name=url")
    DATABASES[_name.strip()] = parse_database_url(_url.strip(), f"LOOP_SQL_DATABASES {_name!r}")

# DATA_DIR 0700, the SQLite files (and their -wal, -shm) 0600, including older ones.
make_private(
    DATA_DIR,
    [
        Path(str(db["NAME"]))
        for db in DATABASES.values()
        if db["ENGINE"] in ("django.db.backends.sqlite3", "pippa_site.sqlite_turns")
        and str(db["NAME"]) != ":memory:"
    ],
)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Counts of failed logins and wrong agent tokens (loop/throttle.py): in Redis when REDIS_URL is
# set, so every server process shares them; otherwise in the server process's memory (the
# embedded default runs one daphne). The default cache is untouched.
CACHES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "pippa-throttle",
            # A Redis that is down or cut off answers within half a second, and the throttle
            # counts in this process meanwhile (loop/throttle.py).
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "throttle"}
    ),
    # Where the throttle counts while Redis is unreachable (and without Redis, the same).
    "throttle-local": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "throttle-local",
    },
}
PIPPA_THROTTLE_SECONDS = env_int("PIPPA_THROTTLE_SECONDS", 15 * 60, low=1)
PIPPA_LOGIN_LIMIT = env_int("PIPPA_LOGIN_LIMIT", 5, low=1)  # per (username, client address)
PIPPA_LOGIN_IP_LIMIT = env_int("PIPPA_LOGIN_IP_LIMIT", 20, low=1)  # per client address
PIPPA_TOKEN_IP_LIMIT = env_int("PIPPA_TOKEN_IP_LIMIT", 20, low=1)  # wrong agent tokens per address

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# The test switch: pytest sets PYTEST_VERSION for its run (the processes a test starts inherit
# it) and nothing else does. Under it, and only under it, passwords use a fast hasher, so the
# many logins of the tests do not each pay PBKDF2's deliberate cost; everywhere else Django's
# strong default stands (tests/test_password_hashers.py).
TESTING = "PYTEST_VERSION" in os.environ
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "loop:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(f"TIME_ZONE: no time zone {TIME_ZONE!r}") from None
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"  # filled by `collectstatic` (bin/up); whitenoise serves it
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
# Every page's Content-Security-Policy (pippa_site/csp.py); set, it replaces the default whole.
CONTENT_SECURITY_POLICY = os.environ.get("CONTENT_SECURITY_POLICY", "")

# Served over TLS (README "TLS"). All off by default: bin/up serves plain http on localhost,
# where a Secure cookie would never be sent back and HSTS would pin the browser to https.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, low=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # probes may speak plain http inside the network
# Behind a TLS-terminating proxy: the header it sets to "https" (e.g. X-Forwarded-Proto). Only
# when the proxy always sets it (and strips a client's own), or anyone can claim https.
_proxy_header = os.environ.get("SECURE_PROXY_SSL_HEADER", "")
if _proxy_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https")

# Email: SMTP when EMAIL_HOST is set, otherwise files under var/mail (never silently dropped).
if os.environ.get("EMAIL_HOST"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = os.environ["EMAIL_HOST"]
    EMAIL_PORT = env_int("EMAIL_PORT", 25, low=1, high=65535)
    EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
    EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 30, low=1)
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = str(DATA_DIR / "mail")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "pippa@localhost")

# Dad is told (DESIGN.md §17, loop/notify): the site's address for links in notifications; the
# webhook that gets each batch of news as JSON; grouping, and reminders of unanswered questions.
SITE_URL = os.environ.get("SITE_URL", "http://127.0.0.1:8000").rstrip("/")
LOOP_NOTIFY = env_bool("LOOP_NOTIFY", True)  # the worker runs the notifier
LOOP_NOTIFY_WEBHOOK_URL = os.environ.get("LOOP_NOTIFY_WEBHOOK_URL", "")
LOOP_NOTIFY_EMAIL = env_bool("LOOP_NOTIFY_EMAIL", True)
# A first piece of news waits this long for the rest of its burst; then a channel sends at most
# once every LOOP_NOTIFY_EVERY seconds (what comes meanwhile goes together in the next one).
LOOP_NOTIFY_GATHER = env_float("LOOP_NOTIFY_GATHER", 5, low=0, high=3600)
LOOP_NOTIFY_EVERY = env_float("LOOP_NOTIFY_EVERY", 60, low=0, high=86400)
LOOP_NOTIFY_POLL = env_float("LOOP_NOTIFY_POLL", 1, low=0.05, high=600)
LOOP_REMIND_AFTER = env_float("LOOP_REMIND_AFTER", 3600, low=1, high=365 * 86400)
LOOP_REMIND_TIMES = env_int("LOOP_REMIND_TIMES", 3, low=0, high=100)
# Web Push: who the push services may write to about this sender (the VAPID "sub" claim).
LOOP_PUSH_CONTACT = os.environ.get("LOOP_PUSH_CONTACT", "mailto:" + DEFAULT_FROM_EMAIL)

# The loop (DESIGN.md).
LOOP_MAX_ATTEMPTS = env_int("LOOP_MAX_ATTEMPTS", 5, low=1)
LOOP_STEP_TIMEOUT = env_int("LOOP_STEP_TIMEOUT", 15 * 60, low=1)
# An API agent's lease from `next`, `renew` (DESIGN.md §8); it keeps its task this long after
# its last claim or renewal unless it lets go first.
LOOP_AGENT_LEASE_SECONDS = env_int("LOOP_AGENT_LEASE_SECONDS", LOOP_STEP_TIMEOUT, low=1)
LOOP_LEASE_SECONDS = env_int("LOOP_LEASE_SECONDS", 30, low=1)
# A worker runs a task's next step in the commit of the last one's verdict for up to this long,
# then lets the lease go so other tasks get a turn.
LOOP_CHAIN_SECONDS = env_float("LOOP_CHAIN_SECONDS", 1, low=0, high=3600)
# A worker moves up to this many tasks a step each per commit. 1 runs one step at a time.
LOOP_BATCH = env_int("LOOP_BATCH", 8, low=1, high=256)
# Side-effect steps a worker performs at once (at most LOOP_BATCH), sharing the outbox's
# commits; of them at most one whose cut would ask a person (loop/step_life.py, ASKING_AT_ONCE).
LOOP_BATCH_EFFECTS = env_int("LOOP_BATCH_EFFECTS", 8, low=1, high=256)
# On PostgreSQL the loop's hot statements are prepared once per connection (loop/sql.py).
# Turn this off behind a pooler that shares server connections between clients per
# transaction and keeps no prepared statements (PgBouncer before 1.21 in transaction mode).
LOOP_PG_PREPARE = env_bool("LOOP_PG_PREPARE", True)
LOOP_HEARTBEAT_SECONDS = env_int("LOOP_HEARTBEAT_SECONDS", 5, low=1)
# A worker on another host is dead once its heartbeat is this old: about two missed beats (one
# on this host is dead as soon as its pid is gone). Live workers look for the dead every
# LOOP_REAP_SECONDS and settle them as boot does (§9), so their tasks move on at once.
LOOP_WORKER_DEAD_AFTER = env_int(
    "LOOP_WORKER_DEAD_AFTER", max(10, 2 * LOOP_HEARTBEAT_SECONDS), low=1
)
# (Each look is one indexed read of the live workers' rows; a write only when one is dead.)
LOOP_REAP_SECONDS = env_float("LOOP_REAP_SECONDS", 0.5, low=0.05, high=3600)
# /healthz lists a worker as late (frozen, partitioned, starved) once its heartbeat is this old
# by the database's clock: a beat and a half, and a second's grace.
LOOP_WORKER_LATE_AFTER = env_float(
    "LOOP_WORKER_LATE_AFTER", 1.5 * LOOP_HEARTBEAT_SECONDS + 1, low=0.1, high=86400
)
# One clock (loop/clock.py): leases and heartbeats use the database's; a worker whose own clock
# is further than this from it says so in its log and on /healthz.
LOOP_CLOCK_SKEW_SECONDS = env_float("LOOP_CLOCK_SKEW_SECONDS", 2, low=0.001, high=86400)
# The host name a worker records and compares (a test or bench pretends to be another host).
LOOP_WORKER_HOST = os.environ.get("LOOP_WORKER_HOST", "")
LOOP_IDLE_SLEEP_MS = env_int("LOOP_IDLE_SLEEP_MS", 200, low=1)
# Retention (`manage.py prune`): with a number of days, each worker's heartbeat thread deletes
# one small batch of finished tasks' history older than that every LOOP_PRUNE_EVERY_SECONDS.
# Off (0) by default: the journal is the person's record, and deleting it is their choice.
LOOP_PRUNE_AFTER_DAYS = env_float("LOOP_PRUNE_AFTER_DAYS", 0, low=0, high=36500)
LOOP_PRUNE_EVERY_SECONDS = env_int("LOOP_PRUNE_EVERY_SECONDS", 10, low=1)
# An API command id replays its stored answer for at least this long; prune keeps it till then.
LOOP_RECEIPT_REPLAY_DAYS = env_float("LOOP_RECEIPT_REPLAY_DAYS", 30, low=0, high=36500)
LOOP_RETRY_BASE_SECONDS = env_int("LOOP_RETRY_BASE_SECONDS", 2, low=0)
LOOP_RETRY_MAX_SECONDS = env_int("LOOP_RETRY_MAX_SECONDS", 300, low=0)
# A schedule may run at most this often (seconds): a cron that would run more often is refused,
# naming its field (five cron fields can't run more often than once a minute).
LOOP_SCHEDULE_MIN_SECONDS = env_int("LOOP_SCHEDULE_MIN_SECONDS", 60, low=60, high=366 * 86400)
LOOP_CONFIRM_SIDE_EFFECTS = env_bool("LOOP_CONFIRM_SIDE_EFFECTS", False)
LOOP_RESUME_UNSENT = os.environ.get("LOOP_RESUME_UNSENT", "scheduled")
if LOOP_RESUME_UNSENT not in {"scheduled", "always"}:
    raise ImproperlyConfigured("LOOP_RESUME_UNSENT must be 'scheduled' or 'always'")
LOOP_MIN_FREE_MB = env_int("LOOP_MIN_FREE_MB", 64, low=0)
# How often each server process's live tailer looks for new journal events.
LOOP_LIVE_POLL_MS = env_int("LOOP_LIVE_POLL_MS", 25, low=1)
# On PostgreSQL the tailer waits for the journal's NOTIFY; it still looks this often, in case
# its listening connection was lost and a notice with it.
LOOP_LIVE_PG_POLL_MS = env_int("LOOP_LIVE_PG_POLL_MS", 2000, low=1)
LOOP_FILE_ROOT = os.environ.get("LOOP_FILE_ROOT", str(DATA_DIR / "files"))
LOOP_SHELL_ENABLED = env_bool("LOOP_SHELL_ENABLED", False)
# shell.run's sandbox (loop/tools/sandbox.py): bubblewrap; the user commands run as when the
# worker is root (bin/install makes it); whether a step may ask for the host's network; bounds.
LOOP_SHELL_BWRAP = os.environ.get("LOOP_SHELL_BWRAP", "bwrap")
LOOP_SHELL_USER = os.environ.get("LOOP_SHELL_USER", "pippa-sandbox")
LOOP_SHELL_NETWORK = env_bool("LOOP_SHELL_NETWORK", False)
LOOP_SHELL_OUTPUT_BYTES = env_int("LOOP_SHELL_OUTPUT_BYTES", 100_000, low=1, high=10_000_000)
LOOP_SHELL_PROCESSES = env_int("LOOP_SHELL_PROCESSES", 128, low=4, high=100_000)
LOOP_SHELL_MEMORY_MB = env_int("LOOP_SHELL_MEMORY_MB", 2048, low=64, high=1 << 20)
LOOP_SHELL_FILE_MB = env_int("LOOP_SHELL_FILE_MB", 1024, low=1, high=1 << 20)
# Secrets a tool call names as ${secret:NAME} (loop/tools/vault.py): PIPPA_SECRET_<NAME> from the
# environment, else this file (JSON, or NAME=value lines), private to the user the loop runs as.
LOOP_SECRETS_FILE = os.environ.get("LOOP_SECRETS_FILE", "")
if LOOP_SECRETS_FILE:
    from loop.tools import vault as _vault

    try:
        _vault.read_file(LOOP_SECRETS_FILE)
    except _vault.SecretError as _exc:
        raise ImproperlyConfigured(str(_exc)) from None
# MCP servers whose tools Pippa may use (loop/mcp/config.py): a JSON or YAML file, checked here.
LOOP_MCP_SERVERS = os.environ.get("LOOP_MCP_SERVERS", "")
if LOOP_MCP_SERVERS:
    from loop.mcp import config as _mcp_config

    try:
        _mcp_config.load(LOOP_MCP_SERVERS)
    except _mcp_config.ConfigError as _exc:
        raise ImproperlyConfigured(str(_exc)) from None
# sql.execute may write the loop's own database only when this is set (it could rewrite receipts).
LOOP_SQL_ALLOW_DEFAULT = env_bool("LOOP_SQL_ALLOW_DEFAULT", False)
LOOP_HTTP_TIMEOUT = env_int("LOOP_HTTP_TIMEOUT", 30, low=1)
# Where http.post/put may ask "do you know this Idempotency-Key?" (a probe); {key} is filled in.
LOOP_HTTP_PROBE_URL = os.environ.get("LOOP_HTTP_PROBE_URL", "")
# URL prefixes of receivers that deduplicate on Idempotency-Key: POST/PUT there are safe to
# repeat, so a cut sends them again instead of asking, and a worker sends many at once.
LOOP_IDEMPOTENT_RECEIVERS = env_list("LOOP_IDEMPOTENT_RECEIVERS", [])
try:
    from loop.tools.receivers import parse_all as _receivers

    _receivers(LOOP_IDEMPOTENT_RECEIVERS)
except ValueError as _exc:
    raise ImproperlyConfigured(f"LOOP_IDEMPOTENT_RECEIVERS: {_exc}") from None
# Where the http tools may not go (loop/tools/room.py): the site itself, where daphne listens
# (host:port; bin/up's HOST and PORT by default), what the operator denies (CIDRs, addresses,
# host names, each with an optional :port), and this host unless a receiver here is listed in
# LOOP_HTTP_ALLOW (the same forms).
_site = f"{os.environ.get('HOST') or '127.0.0.1'}:{os.environ.get('PORT') or '8000'}"
LOOP_SITE_ADDRESSES = env_list("LOOP_SITE_ADDRESSES", [_site])
LOOP_HTTP_DENY = env_list("LOOP_HTTP_DENY", [])
LOOP_HTTP_ALLOW = env_list("LOOP_HTTP_ALLOW", [])
for _setting, _entries in [
    ("LOOP_SITE_ADDRESSES", LOOP_SITE_ADDRESSES),
    ("LOOP_HTTP_DENY", LOOP_HTTP_DENY),
    ("LOOP_HTTP_ALLOW", LOOP_HTTP_ALLOW),
]:
    from loop.tools.room import parse_all as _room

    try:
        _room(_entries, port_required=_setting == "LOOP_SITE_ADDRESSES")
    except ValueError as _exc:
        raise ImproperlyConfigured(f"{_setting}: {_exc}") from None
# Plan input (CLI, dashboard, API, admin): bytes of the document and of the expanded plan, and
# how deeply its values may nest (API bodies too). Larger API bodies are 413s at
# DATA_UPLOAD_MAX_MEMORY_SIZE (Django's, 2.5 MB).
# The model judge (DESIGN.md §12): any OpenAI-compatible chat-completions endpoint.
LOOP_LLM_BASE_URL = os.environ.get("LOOP_LLM_BASE_URL", "")
LOOP_LLM_MODEL = os.environ.get("LOOP_LLM_MODEL", "pippa")
LOOP_LLM_API_KEY = os.environ.get("LOOP_LLM_API_KEY", "none")
LOOP_LLM_MAX_TURNS = env_int("LOOP_LLM_MAX_TURNS", 12, low=1)  # model requests in one tick
LOOP_LLM_TIMEOUT_SECONDS = env_float("LOOP_LLM_TIMEOUT_SECONDS", 60, low=0.1, high=3600)
# Tool results and earlier outputs shown to the model are cut to this, with a note.
LOOP_LLM_RESULT_CHARS = env_int("LOOP_LLM_RESULT_CHARS", 8000, low=1)
# Every model request carries the conversation (DESIGN.md §10): the messages since its task
# began and the latest before, at most this many (the newest; a note says how many were left
# out). What Pippa writes with `say` is at most LOOP_SAY_CHARS characters.
LOOP_LLM_CONVERSATION_MESSAGES = env_int("LOOP_LLM_CONVERSATION_MESSAGES", 30, low=1, high=1000)
LOOP_SAY_CHARS = env_int("LOOP_SAY_CHARS", 2000, low=1, high=10_000)
# How long a tick keeps retrying an endpoint that is down before it parks the worker.
LOOP_LLM_RETRY_SECONDS = env_float("LOOP_LLM_RETRY_SECONDS", 60, low=0, high=86400)
# The model's bounds (DESIGN.md §12 "Bounds"). Sent as `max_tokens` with every request:
LOOP_LLM_MAX_TOKENS = env_int("LOOP_LLM_MAX_TOKENS", 4096, low=1, high=500_000)
# A reply's body: a longer one is not kept, and the attempt is over (its retry counts).
LOOP_LLM_MAX_REPLY_BYTES = env_int("LOOP_LLM_MAX_REPLY_BYTES", 512 * 1024, low=1024)
# One call's arguments (UTF-8 bytes), and the calls of one reply: the rest get an error result.
LOOP_LLM_MAX_ARG_BYTES = env_int("LOOP_LLM_MAX_ARG_BYTES", 64 * 1024, low=16)
LOOP_LLM_MAX_CALLS = env_int("LOOP_LLM_MAX_CALLS", 16, low=1, high=1000)
# The tokens (prompt and completion, as the endpoint counts them) of a step, over its attempts.
LOOP_LLM_STEP_TOKENS = env_int("LOOP_LLM_STEP_TOKENS", 1_000_000, low=1)
# A model step whose attempt was given back this many times (the endpoint down) fails.
LOOP_LLM_GIVE_BACKS = env_int("LOOP_LLM_GIVE_BACKS", 20, low=0, high=100_000)
# A plan or revision written by Pippa or an agent waits for a person's approval (DESIGN.md §5,
# "Who wrote it"): `side_effects` (one that adds side-effect steps waits; read-only ones run at
# once), `always`, or `never` (the seeds' older rule: Pippa's and agents' side effects run
# unasked). `true` and `false`, as older versions took, read as `always` and `never`.
LOOP_CONFIRM_PLANS = {"true": "always", "false": "never"}.get(
    os.environ.get("LOOP_CONFIRM_PLANS", "").strip().lower(),
    os.environ.get("LOOP_CONFIRM_PLANS", "").strip().lower() or "side_effects",
)
if LOOP_CONFIRM_PLANS not in {"side_effects", "always", "never"}:
    raise ImproperlyConfigured(
        "LOOP_CONFIRM_PLANS: must be side_effects, always or never, "
        f"not {os.environ.get('LOOP_CONFIRM_PLANS')!r}"
    )
LOOP_PLAN_MAX_BYTES = env_int("LOOP_PLAN_MAX_BYTES", 512 * 1024, low=1)
LOOP_PLAN_MAX_DEPTH = env_int("LOOP_PLAN_MAX_DEPTH", 32, low=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "loop": {"handlers": ["console"], "level": os.environ.get("LOOP_LOG_LEVEL", "INFO")},
    },
}
