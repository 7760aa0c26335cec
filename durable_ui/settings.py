"""Settings for durable-ui, read from the environment (see README "Configuration")."""

import os
from importlib.util import find_spec
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from durable_ui.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
# django-ninja's Swagger UI page and its static files, served from here, not a CDN (runs/api/docs.py).
# Found without importing ninja, and not an installed app: an app is imported by every process at
# start-up, and ninja with pydantic cost each worker ~0.12 s before it could resume a run.
NINJA_DIR = Path(find_spec("ninja").submodule_search_locations[0])

DEBUG = env_bool("DEBUG", False)
DEV_SECRET_KEY = "insecure-dev-key-set-SECRET_KEY-in-production"
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# DURABLE_PRODUCTION=1 is a deployment behind gunicorn (README "Deploying"): HTTPS-only settings, and
# static files collected, compressed and cache-busted. It is a switch of its own rather than "DEBUG off"
# because DEBUG is off everywhere by default — tests, `make demo`, workers — and those serve plain
# http on localhost from the source folders.
PRODUCTION = env_bool("DURABLE_PRODUCTION", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DURABLE_PRODUCTION=1 needs DEBUG=0: debug pages show settings and source")
if PRODUCTION and (SECRET_KEY == DEV_SECRET_KEY or len(SECRET_KEY) < 50):
    raise ImproperlyConfigured("DURABLE_PRODUCTION=1 needs a SECRET_KEY of 50+ random characters of its own")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "journal",
    "runs",
    "examples",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files from the app server, before any other work
    "runs.middleware.RefuseNulMiddleware",  # 400 before PostgreSQL sees a NUL in a path, query, form or cookie
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "durable_ui.urls"
WSGI_APPLICATION = "durable_ui.wsgi.application"

TEMPLATES = [
    {
        # Django's backend whose output is always writable as UTF-8 (see durable_ui/templating.py).
        # NAME keeps "django": django-template-partials finds the backend to wrap by that name.
        "BACKEND": "durable_ui.templating.DjangoTemplates",
        "NAME": "django",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "runs.context_processors.dashboard",
            ],
        },
    },
]

# SQLite (the embedded default) runs in WAL mode so a web process and a worker share it;
# IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend, with this process's writers queued on a lock instead of SQLite's sleeping busy
    # handler (journal/store/sqlite_backend/base.py says what that saves).
    DATABASES["default"]["ENGINE"] = "journal.store.sqlite_backend"
    DATABASES["default"]["OPTIONS"] = {
        "timeout": env_int("DURABLE_SQLITE_TIMEOUT", 30, minimum=1),
        "transaction_mode": "IMMEDIATE",
        "init_command": (
            "PRAGMA journal_mode=WAL;"
            f"PRAGMA synchronous={env_str('DURABLE_SQLITE_SYNCHRONOUS', 'FULL')};"
            "PRAGMA foreign_keys=ON;"
        ),
    }
    DATABASES["default"]["TEST"] = {"NAME": env_str("DURABLE_SQLITE_TEST_NAME", str(BASE_DIR / "test-db.sqlite3"))}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_DIR / "static"]
# In production WhiteNoise serves what collectstatic wrote to STATIC_ROOT: gzip-compressed, names carrying
# a hash of their content (so browsers may cache them forever). Elsewhere (tests, the demo, runserver with
# DEBUG off) it serves the source folders as they are: no collectstatic, no manifest, and no STATIC_ROOT
# (WhiteNoise would warn that it does not exist).
STATIC_ROOT = Path(env_str("STATIC_ROOT", "") or BASE_DIR / "staticfiles") if PRODUCTION else None
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage" if PRODUCTION
                    else "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_KEEP_ONLY_HASHED_FILES = PRODUCTION

# --- HTTPS (production) -------------------------------------------------------------------------
# On by default in production; each can be relaxed, e.g. all three off for a plain-http test on localhost.
# Behind a proxy that terminates TLS, name the header it sets (X-Forwarded-Proto) in
# DURABLE_PROXY_SSL_HEADER so Django knows the request was https; only do so if the proxy always sets it.
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("DURABLE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DURABLE_SECURE_COOKIES", True)
    SECURE_HSTS_SECONDS = env_int("DURABLE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DURABLE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("DURABLE_HSTS_PRELOAD", True)
    _proxy_header = env_str("DURABLE_PROXY_SSL_HEADER", "").strip()
    if _proxy_header:
        SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- the durable engine ---------------------------------------------------------------
DURABLE_AGENT_MODULES = env_list("DURABLE_AGENT_MODULES", [])
DURABLE_LEASE_SECONDS = env_int("DURABLE_LEASE_SECONDS", 30, minimum=1, maximum=30)
DURABLE_MAX_PAYLOAD_BYTES = env_int("DURABLE_MAX_PAYLOAD_BYTES", 1_000_000, minimum=1024)  # UTF-8 bytes of JSON
DURABLE_WHATIF_MODELS = env_list("DURABLE_WHATIF_MODELS", [])  # models a what-if may switch a model call to
DURABLE_MAX_NESTING = env_int("DURABLE_MAX_NESTING", 64, minimum=8, maximum=1000)  # arrays and objects, deepest
def _default_sandbox_root() -> str:
    """var/sandboxes in the checkout, unless a parent folder is closed to other users (a 0700 home):
    sandboxed commands run as an unprivileged uid that must be able to reach its directory."""
    import hashlib

    if all(os.stat(p).st_mode & 0o001 for p in BASE_DIR.parents if p.exists()):
        return str(BASE_DIR / "var" / "sandboxes")
    return f"/var/tmp/durable-ui-{hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:8]}/sandboxes"


DURABLE_SANDBOX_ROOT = env_str("DURABLE_SANDBOX_ROOT", "") or _default_sandbox_root()
DURABLE_READ_ONLY = env_bool("DURABLE_READ_ONLY", False)
# Concurrent runs of one process share journal commits (journal/store/groupcommit.py). Unset: on for
# SQLite (one writer at a time: sharing is the only way to share an fsync), off for PostgreSQL (the
# server already flushes concurrent commits' WAL together; a queue in the client only serializes them).
DURABLE_GROUP_COMMIT = env_bool("DURABLE_GROUP_COMMIT") if os.environ.get("DURABLE_GROUP_COMMIT") else None
# PostgreSQL: a run made runnable sends NOTIFY with its transaction, and every worker LISTENs, so a
# worker in another process claims it at once rather than at its next poll (journal/store/doorbell.py).
DURABLE_PG_NOTIFY = env_bool("DURABLE_PG_NOTIFY", True)
DURABLE_RETENTION_INTERVAL = env_int("DURABLE_RETENTION_INTERVAL", 3600, minimum=60)  # seconds between purges
# A Celery task meeting a database outage retries this many times (backoff up to 60 s); then beat's sweep rings.
DURABLE_CELERY_DB_RETRIES = env_int("DURABLE_CELERY_DB_RETRIES", 30, minimum=0)

# --- the distributed path -------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
DURABLE_CELERY = env_bool("DURABLE_CELERY", False)
DURABLE_CELERY_APP = "durable_ui.celery"  # imported before the first message is sent (journal/integrations/bell.py)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"journal": {"handlers": ["console"], "level": env_str("DURABLE_LOG_LEVEL", "INFO")}},
}
