"""Settings from environment variables (12-factor), each with a default that works
on one laptop: no variables set means a SQLite file and a server-less broker."""

import json
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RESPAWN_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
# The control plane's alone: the database, keys, queue and logs. Run as root, local VMs run
# as users of their own (respawn_server.jobs.fleet.providers.local) and need the search bit to reach their
# own directories in local-vms/ and checkpoints/; they can list nothing here, and every
# other entry is 0600 or 0700.
VAR_DIR.chmod(0o711 if os.geteuid() == 0 else 0o700)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_count(name: str) -> int | None:
    """A whole number >= 0 from `name`, None when unset; anything else stops start-up naming it."""
    raw = os.environ.get(name, "")
    if not raw:
        return None
    if not raw.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number >= 0, got {raw!r}")
    return int(raw)


def secret_from_env_or_file(name: str, default: str | None = None) -> str | None:
    """`NAME` or the contents of the file named by `NAME_FILE` (Docker/K8s secrets)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get(name, default)


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = secret_from_env_or_file("DJANGO_SECRET_KEY")
# Optional bearer token for /metrics; open to any scraper when unset.
RESPAWN_METRICS_TOKEN = secret_from_env_or_file("RESPAWN_METRICS_TOKEN", "")
if not SECRET_KEY:
    # A laptop default that is stable across restarts of `make demo`, never shipped:
    # production must set DJANGO_SECRET_KEY (check --deploy says so).
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(os.urandom(32).hex())
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "respawn_server.jobs",
    "respawn_server.frontend",
]

MIDDLEWARE = [
    # First, so that static files (answered by WhiteNoise below) carry the policy too.
    "respawn_server.csp.content_security_policy",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from gunicorn (no CDN, no separate server on a laptop).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "respawn_server.urls"
WSGI_APPLICATION = "respawn_server.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'respawn.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Every job's env is in it: owner-only before SQLite first opens it (its -wal and -shm
    # files take the database file's mode).
    if DATABASES["default"]["NAME"] not in ("", ":memory:"):
        os.close(os.open(DATABASES["default"]["NAME"], os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(DATABASES["default"]["NAME"], 0o600)
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web process read while a worker writes; IMMEDIATE takes the
        # write lock at BEGIN so two writers queue on the busy timeout instead of
        # deadlocking on a read-to-write lock upgrade.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # In a folder of its own: Django makes the test database with the default mode.
    (VAR_DIR / "test-db").mkdir(mode=0o700, exist_ok=True)
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db" / "test.sqlite3")}
elif os.environ.get("RESPAWN_DB_PREPARED_STATEMENTS", "on") == "off":
    # Behind a pooler that cannot keep prepared statements (PgBouncer in transaction
    # mode before 1.21): the heartbeat's one prepared statement is run unprepared too.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", VAR_DIR / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise expects it even when serving through finders
# Finders serve app static directly, so `make demo` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

# Agents post bounded batches; anything bigger is refused before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("RESPAWN_MAX_BODY_BYTES", 1024 * 1024))

# --- security (production values; `check --deploy` is clean with DJANGO_DEBUG unset) ---
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
# Health checks and scrapers call the container directly over plain HTTP, inside the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Our own scripts and styles only, none inline (the dashboard, the admin and the API
# docs have none); images may be data: URIs (Swagger UI's icons).
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "respawn_server.jobs.people.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSON parser, refusing bodies nested too deep to read (respawn_server.jobs.api.parsing).
    "DEFAULT_PARSER_CLASSES": ["respawn_server.jobs.api.parsing.JSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "DEFAULT_PAGINATION_CLASS": "respawn_server.jobs.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["respawn_server.jobs.api.filters.IdFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "respawn_server.jobs.api.schema.RespawnAutoSchema",
    "EXCEPTION_HANDLER": "respawn_server.jobs.api.errors.exception_handler",
    # Per client address (login) and per person (minting tokens).
    "DEFAULT_THROTTLE_RATES": {
        "login": os.environ.get("RESPAWN_LOGIN_RATE", "20/min"),
        "token_create": os.environ.get("RESPAWN_TOKEN_CREATE_RATE", "30/hour"),
    },
    # Proxies in front of gunicorn whose X-Forwarded-For entries are trusted. Without
    # a number DRF would take the whole header, which any client can set, and a
    # login rate limit would be a header away from bypassed.
    "NUM_PROXIES": int(os.environ.get("RESPAWN_NUM_PROXIES", 0)),
}

# The workers' task-failure counts for /metrics. Local memory is per process: point
# RESPAWN_CACHE_URL at Redis for /metrics to see them. (Rate limits count in the database.)
CACHE_URL = os.environ.get("RESPAWN_CACHE_URL", "")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL,
                "KEY_PREFIX": os.environ.get("RESPAWN_CACHE_PREFIX", "respawn")}
    if CACHE_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Respawn API",
    "DESCRIPTION": "Jobs on spot VMs: the people's API (/api/v1/) and the agent API (/api/agent/v1/).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from our own static files (drf-spectacular-sidecar), not a CDN's latest.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "CheckpointKindEnum": "respawn.protocol.CheckpointKind.ALL",
        "TierEnum": "respawn.protocol.CheckpointTier.ALL",  # a checkpoint's tiers and a regroup's resume tier
        "InterruptionKindEnum": "respawn_server.jobs.core.choices.InterruptionKind.CHOICES",
        "DeliveryStatusEnum": "respawn_server.jobs.core.choices.DeliveryStatus.CHOICES",
        "JobStatusEnum": "respawn_server.jobs.core.choices.JobStatus.CHOICES",
    },
}

# --- Celery ---
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Its own variable so that processes with different var dirs (a test and the worker
    # it starts) can still share one queue.
    _broker_dir = Path(os.environ.get("RESPAWN_BROKER_DIR", VAR_DIR / "broker"))
    _broker_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the tasks' arguments are ours alone
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),  # else kombu writes ./control in the working dir
        "store_processed": False,
        # An idle worker looks for new tasks this often (kombu's default is 1 s): with a
        # relaunch taking two hops (schedule, launch), it bounds the relaunch latency.
        "polling_interval": 0.1,
    }
else:
    # Redis returns an unacked task after the visibility timeout: minutes, not the
    # default hour, so a task held by a killed worker runs again soon. A key prefix lets
    # deployments (or concurrent test runs) share one Redis without taking each other's tasks.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": int(os.environ.get("RESPAWN_VISIBILITY_TIMEOUT_S", 300)),
                                       "global_keyprefix": os.environ.get("RESPAWN_BROKER_KEY_PREFIX", "")}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

RECONCILE_INTERVAL_S = env_float("RESPAWN_RECONCILE_INTERVAL_S", 15.0)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "respawn_server.jobs.tasks.reconcile",
        "schedule": timedelta(seconds=RECONCILE_INTERVAL_S),
        "options": {"expires": RECONCILE_INTERVAL_S},
    },
}

# --- Respawn ---
# Per-provider constructor settings (JSON), e.g. {"aws": {"endpoint_url": "..."}, "gcp": {"project": "p"}};
# the local provider's defaults below are merged under its entry.
PROVIDER_CONFIG = json.loads(os.environ.get("RESPAWN_PROVIDER_CONFIG", "{}"))
PROVIDER_CONFIG["local"] = {
    "root": str(VAR_DIR / "local-vms"),
    # The simulated spot market: none | every | rate | trace (jobs/fleet/providers/local_market.py).
    "market_mode": os.environ.get("RESPAWN_LOCAL_MARKET", "rate"),
    "market_every_s": env_float("RESPAWN_LOCAL_PREEMPT_EVERY_S", 60.0),
    "market_rate_per_hour": env_float("RESPAWN_LOCAL_PREEMPTIONS_PER_HOUR", 20.0),
    "notice_lead_s": env_float("RESPAWN_LOCAL_NOTICE_S", 30.0),
    # Only the first N spot VMs are ever preempted (unset: no limit): exactly N interruptions.
    "market_max_preemptions": env_count("RESPAWN_LOCAL_MAX_PREEMPTIONS"),
    # Seconds a local VM takes to boot before its agent starts (a cloud's image, drivers, agent install).
    "boot_delay_s": env_float("RESPAWN_LOCAL_BOOT_DELAY_S", 0.0),
    **PROVIDER_CONFIG.get("local", {}),
}

RESPAWN = {
    # Heartbeats and their timeout: seconds, fractions allowed so tests run fast.
    "HEARTBEAT_INTERVAL_S": env_float("RESPAWN_HEARTBEAT_INTERVAL_S", 10.0),
    "HEARTBEAT_TIMEOUT_S": env_float("RESPAWN_HEARTBEAT_TIMEOUT_S", 120.0),
    # How long a fenced instance's token still accepts checkpoints, logs and exit.
    "FENCE_GRACE_S": env_float("RESPAWN_FENCE_GRACE_S", 600.0),
    "PROVIDERS": [p for p in os.environ.get("RESPAWN_PROVIDERS", "local").split(",") if p],
    "NOTICE_BUDGET_S": env_float("RESPAWN_NOTICE_BUDGET_S", 25.0),
    "RECONCILE_BATCH": int(os.environ.get("RESPAWN_RECONCILE_BATCH", 200)),
    "DEFAULT_CHECKPOINT_INTERVAL_S": env_float("RESPAWN_CHECKPOINT_INTERVAL_S", 600.0),
    # How the agents (and the reconciler's health probe) reach the API.
    "API_URL": os.environ.get("RESPAWN_API_URL", "http://127.0.0.1:8000"),
    "DEFAULT_CHECKPOINT_URI": os.environ.get("RESPAWN_CHECKPOINT_URI", str(VAR_DIR / "checkpoints")),
    # The agent's wheel and pinned requirements VMs install (respawn_server.jobs.fleet.agent_dist; manage.py build_agent_wheel).
    "AGENT_DIST_DIR": os.environ.get("RESPAWN_AGENT_DIST_DIR", str(VAR_DIR / "dist")),
    # Jobs' uploaded source archives, one file per SHA-256 (respawn_server.jobs.core.sources), and the most
    # bytes an archive, or the files it unpacks to, may hold (the CLI checks the same variable).
    "SOURCE_DIR": os.environ.get("RESPAWN_SOURCE_DIR", str(VAR_DIR / "sources")),
    "SOURCE_MAX_BYTES": int(os.environ.get("RESPAWN_SOURCE_MAX_BYTES", 100 * 1024 * 1024)),
    # Encrypts jobs' secret env values (respawn_server.jobs.core.secret_env): Fernet keys, comma-separated,
    # the first encrypting; unset, a key made in SECRETS_KEY_FILE at first use.
    "SECRETS_KEY": secret_from_env_or_file("RESPAWN_SECRETS_KEY", ""),
    "SECRETS_KEY_FILE": str(VAR_DIR / "secrets.key"),
    "PROVIDER_CONFIG": PROVIDER_CONFIG,
    # GPUs the whole deployment may hold at once (an org's cloud quota); teams share it fairly.
    "MAX_CONCURRENT_GPUS": int(os.environ["RESPAWN_MAX_CONCURRENT_GPUS"]) if os.environ.get("RESPAWN_MAX_CONCURRENT_GPUS") else None,
    "SCHEDULE_BATCH": int(os.environ.get("RESPAWN_SCHEDULE_BATCH", 50)),
    "PLACEMENT_BACKOFF_S": env_float("RESPAWN_PLACEMENT_BACKOFF_S", 900.0),
    # A `requested` instance with no VM this long after its request gets its launch sent again.
    "LAUNCH_RESEND_S": env_float("RESPAWN_LAUNCH_RESEND_S", 60.0),
    # An instance that has not registered this long after its launch request is replaced.
    "PROVISION_TIMEOUT_S": env_float("RESPAWN_PROVISION_TIMEOUT_S", 900.0),
    # An elastic gang below its full size tries to grow back this long after it shrank, and
    # again this long after each try that capacity refused (docs/elastic.md).
    "GROW_RETRY_S": env_float("RESPAWN_GROW_RETRY_S", 300.0),
    "MAX_LOG_LINES_PER_BATCH": int(os.environ.get("RESPAWN_MAX_LOG_LINES", 1000)),
    # The price refreshers (jobs/money/refreshers/config.py: RefreshConfig's fields).
    "PRICE_REFRESH": {
        "azure_prices_url": os.environ.get("RESPAWN_AZURE_PRICES_URL", "https://prices.azure.com/api/retail/prices"),
        "gcp_billing_url": os.environ.get("RESPAWN_GCP_BILLING_URL", "https://cloudbilling.googleapis.com"),
        "gcp_api_key": secret_from_env_or_file("RESPAWN_GCP_BILLING_API_KEY"),
        "aws_endpoint_url": PROVIDER_CONFIG.get("aws", {}).get("endpoint_url"),
        "aws_lookback_h": env_float("RESPAWN_AWS_PRICE_LOOKBACK_H", 24.0),
        "max_pages": int(os.environ.get("RESPAWN_PRICE_MAX_PAGES", 200)),
    },
}

# Prices are refreshed only when asked for (a laptop has the shipped price book), for
# each enabled cloud that publishes prices.
PRICE_REFRESH_S = env_float("RESPAWN_PRICE_REFRESH_S", 0.0)
if PRICE_REFRESH_S > 0:
    for _cloud in (p for p in RESPAWN["PROVIDERS"] if p in ("aws", "azure", "gcp")):
        CELERY_BEAT_SCHEDULE[f"refresh-prices-{_cloud}"] = {
            "task": "respawn_server.jobs.tasks.refresh_prices",
            "schedule": timedelta(seconds=PRICE_REFRESH_S),
            "args": (_cloud,),
            "options": {"expires": PRICE_REFRESH_S},
        }

# Notifications (respawn_server.jobs.notify). Webhooks to loopback and private addresses are refused
# unless allowed (a demo or test receiver on 127.0.0.1); link-local never (the metadata service).
NOTIFY = {
    "ALLOW_PRIVATE": env_bool("RESPAWN_NOTIFY_ALLOW_PRIVATE", False),
    "TIMEOUT_S": env_float("RESPAWN_NOTIFY_TIMEOUT_S", 5.0),
    "MAX_RETRIES": int(os.environ.get("RESPAWN_NOTIFY_MAX_RETRIES", 5)),
    "BACKOFF_S": int(os.environ.get("RESPAWN_NOTIFY_BACKOFF_S", 2)),
    "BACKOFF_MAX_S": int(os.environ.get("RESPAWN_NOTIFY_BACKOFF_MAX_S", 300)),
}
EMAIL_BACKEND = os.environ.get("RESPAWN_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("RESPAWN_EMAIL_FROM", "respawn@localhost")
EMAIL_HOST = os.environ.get("RESPAWN_EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("RESPAWN_EMAIL_PORT", 25))

LOG_FORMAT = os.environ.get("RESPAWN_LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"RESPAWN_LOG_FORMAT must be 'plain' or 'json', not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   "json": {"()": "respawn_server.logging.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("RESPAWN_LOG_LEVEL", "INFO")},
    # azure-core logs every HTTP request and response header at INFO: a worker's log
    # would be mostly that. Its warnings (retries, failures) still show.
    "loggers": {"django.db.backends": {"level": "WARNING"},
                "azure.core.pipeline.policies.http_logging_policy": {"level": "WARNING"}},
}
