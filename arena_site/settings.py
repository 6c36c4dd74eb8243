"""Settings for Fix Arena, read from environment variables with safe defaults.

With no configuration at all the arena runs embedded: SQLite, an in-memory channel layer and an
in-process generation worker. `DATABASE_URL` and `REDIS_URL` switch it to PostgreSQL, the Redis
channel layer and Celery workers: the same code paths, only the backends change.
"""

import ipaddress
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("ARENA_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def float_dtype(name: str, default: str) -> str:
    """A float dtype's name from the environment variable ``name``: empty (the model's own),
    float32, bfloat16 or float16."""
    value = os.environ.get(name, default)
    if value not in ("", "float32", "bfloat16", "float16"):
        raise ImproperlyConfigured(f"{name}: {value!r} is none of float32, bfloat16, float16 or empty.")
    return value


def _local_secret_key() -> str:
    """A random key kept in var/ so embedded sessions survive restarts; never committed."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = os.environ.get("SECRET_KEY") or _local_secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")
# Addresses or networks (CIDR) of the reverse proxies in front of the site. Only a request whose
# peer is one of them has its X-Forwarded-For read, and the client is its right-most hop that is
# not a trusted proxy (arena_site/asgi.py); empty, the default: the peer is the client and the
# header is ignored, so nobody can pick the address their limits are counted under.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", "")
for _proxy in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy)
    except ValueError as _exc:
        raise ImproperlyConfigured(
            f"TRUSTED_PROXIES: {_proxy!r} is not an IP address or network (e.g. 10.0.0.5 or 172.16.0.0/12)."
        ) from _exc

# Behind TLS in production: HTTPS=1 turns on secure cookies, HSTS and the redirect.
HTTPS = env_bool("HTTPS", False)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000" if HTTPS else "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
# Preloading asks browsers to hard-code HTTPS for the domain and every subdomain, for months
# after it is undone: a decision for the domain's owner, so opt-in (the deploy check's reminder
# of it, security.W021, is silenced while it is off).
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
if env_bool("BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (django-csp): scripts, styles, images, fonts and
# connections only from this origin, so an injected tag or a poisoned reply can neither run nor
# load anything, nor send what it reads elsewhere. No inline script, handler or style attribute
# is allowed; the pages have none (tests/test_content_security_policy.py loads each in chromium
# and fails on any violation). 'self' covers the battle websocket of the same host and port.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# Admin and researcher accounts: Django's own password rules (the admin's forms and
# createsuperuser apply them).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # As an app, django-ninja renders its API docs with the Swagger UI and ReDoc it ships as
    # static files; otherwise it loads them from a CDN, and the docs are blank offline.
    "ninja",
    "axes",
    "csp",
    # Prometheus: the web tier's request, response and latency metrics (its middleware below);
    # /metrics itself is answered by arena_site.health.
    "django_prometheus",
    "inference",
    "votes",
    "leaderboard",
]

MIDDLEWARE = [
    # Outermost: answers /healthz before the Host check and the HTTPS redirect (arena_site.health).
    "arena_site.health.HealthCheckMiddleware",
    # django-prometheus times what lies between its two middlewares: every request but the probes
    # (/healthz, /readyz, /metrics, answered above).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    # Outside the compression: files (WhiteNoise's, the dumps) pulled a chunk at a time under
    # ASGI, not read whole, and compressed as one stream.
    "arena_site.file_streaming.AsyncFileStreamingMiddleware",
    # Outside WhiteNoise, so that the static files it serves are compressed too.
    "arena_site.compression.TextGZipMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Responses by status and view (a view's name, never its path: no battle id in a label).
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Innermost, so it sees the views' exceptions first: a database outage becomes a clear 503.
    "arena_site.unavailable.DatabaseUnavailableMiddleware",
    # Last, as django-axes asks: it answers a locked-out login.
    "axes.middleware.AxesMiddleware",
]

# Admin logins: django-axes counts failed attempts per client address (the one the limits use,
# arena_site.addresses) and locks the address out of logging in for a while after too many.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("ARENA_LOGIN_FAILURES", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("ARENA_LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = ["ip_address"]
AXES_CLIENT_IP_CALLABLE = "arena_site.addresses.login_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # No banner on every start.

ROOT_URLCONF = "arena_site.urls"
ASGI_APPLICATION = "arena_site.asgi.application"

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
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'arena.sqlite3'}",
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # The embedded arena's generation threads write (every flush of every streaming reply) while
    # the web tier reads and writes. SQLite fails a deferred transaction that read and then
    # writes at once, without waiting ("database is locked"), whenever another connection is
    # writing: transactions therefore take the write lock when they begin (IMMEDIATE) and wait
    # for it up to the timeout. WAL lets readers go on while one connection writes.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=20,
        transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve straight from the apps' static folders when collectstatic has not been run (embedded).
WHITENOISE_USE_FINDERS = True
# collectstatic (production) also writes a gzip-compressed copy of each file, which WhiteNoise
# then serves as they are; no manifest, so pages work whether or not it was run.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- Channels and Celery -------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's layer, with one receiver per process that a consumer leaving
            # cannot cancel (arena_site/channel_layer.py: the stock one loses others' frames).
            "BACKEND": "arena_site.channel_layer.PumpedRedisChannelLayer",
            "CONFIG": {
                # redis-py's 5 s default socket timeout kills idle websockets (the layer blocks
                # longer than that while waiting): no timeout on the layer's connections.
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                # The layer silently drops messages above capacity; deltas are batched, but a
                # long reply to a slow client must still fit.
                "capacity": 1000,
                "expiry": 120,
                "prefix": os.environ.get("CHANNEL_PREFIX", "asgi"),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Without a broker, generation runs on a thread inside the web process (embedded mode).
GENERATION_BACKEND = "celery" if REDIS_URL else "in-process"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# When Redis goes away, replies being generated go on: they are saved to the database as they
# stream, and a job the broker redelivers later finds its reply finished (claim_reply).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False

# --- Arena ---------------------------------------------------------------------------------------
# An inference worker sharing its host with the web tier lowers its own CPU priority once its
# frame relay is started (votes.tasks.start_frame_relay): its nice value by this much, and
# with SCHED_IDLE it runs only when nothing else wants a core. Neither on hosts of its own.
ARENA_WORKER_NICE = int(os.environ.get("ARENA_WORKER_NICE", "0"))
ARENA_WORKER_SCHED_IDLE = env_bool("ARENA_WORKER_SCHED_IDLE", False)
# Threads per web process for the battle sockets' queries (votes.consumers.query_threads).
ARENA_WEB_QUERY_THREADS = int(os.environ.get("ARENA_WEB_QUERY_THREADS", "16"))
ARENA_MAX_PROMPT_CHARS = int(os.environ.get("ARENA_MAX_PROMPT_CHARS", "2000"))
ARENA_MAX_FRAME_BYTES = int(os.environ.get("ARENA_MAX_FRAME_BYTES", "16384"))
ARENA_MAX_TURNS = int(os.environ.get("ARENA_MAX_TURNS", "12"))
# The longest conversation a side may hold, as inference.context_budget counts it (UTF-8 bytes of
# its texts, plus 16 a message and 192 once): an upper bound on its tokens with any model. Past it
# the arena refuses the next prompt, the same with every pair; anonymous battles draw only models
# whose context holds it and a whole reply (the imports' 2048 tokens hold 1900 and 96 new tokens).
ARENA_MAX_CONVERSATION_BYTES = int(os.environ.get("ARENA_MAX_CONVERSATION_BYTES", "1900"))
# Battles, messages and votes per session and per client network (/24, /64) in a window
# (votes/rate_limits.py): "action=per_session/per_network/window_seconds,..."; actions left out
# keep their defaults.
ARENA_RATE_LIMITS = os.environ.get("ARENA_RATE_LIMITS", "")
# New page sessions (rows in the session table) one client network may create an hour; 0: no cap.
ARENA_NEW_SESSIONS_PER_NETWORK = int(os.environ.get("ARENA_NEW_SESSIONS_PER_NETWORK", "240"))
# Open battle sockets at once per voter session and per client network (/24 IPv4, /64 IPv6), across
# every web process (votes/socket_caps.py); past either the socket is closed with 4429. 0: no cap.
ARENA_SOCKETS_PER_SESSION = int(os.environ.get("ARENA_SOCKETS_PER_SESSION", "8"))
ARENA_SOCKETS_PER_NETWORK = int(os.environ.get("ARENA_SOCKETS_PER_NETWORK", "64"))
# Replies one client network may have queued or streaming at once (votes/reply_caps.py); keep it
# below the workers' concurrency so that one network never holds them all. 0: no cap.
ARENA_REPLIES_PER_NETWORK = int(os.environ.get("ARENA_REPLIES_PER_NETWORK", "4"))
# A battle socket whose client has not read what it was sent (over 64 KB waiting), or an HTTP
# response whose client has not (over 8 KB waiting), for this long is dropped, with what was
# buffered for it (arena_site.backpressure).
ARENA_SLOW_READER_SECONDS = float(os.environ.get("ARENA_SLOW_READER_SECONDS", "15"))
# Pair sampling (votes/pairing.py): "weighted" (admin weights) or "active" (also favours pairs whose
# win rate is least certain); a new model is drawn up to 1 + BOOST times as often until it has
# had NEW_MODEL_BATTLES battles.
ARENA_PAIR_SAMPLING = os.environ.get("ARENA_PAIR_SAMPLING", "weighted")
ARENA_NEW_MODEL_BOOST = float(os.environ.get("ARENA_NEW_MODEL_BOOST", "1"))
ARENA_NEW_MODEL_BATTLES = int(os.environ.get("ARENA_NEW_MODEL_BATTLES", "50"))
ARENA_MAX_NEW_TOKENS = int(os.environ.get("ARENA_MAX_NEW_TOKENS", "96"))
# The most seconds any reply may take (a model's own max_reply_seconds may be less): a reply
# still writing then ends as done, its text kept, and says it was cut.
ARENA_MAX_REPLY_SECONDS = float(os.environ.get("ARENA_MAX_REPLY_SECONDS", "60"))
# Deltas are flushed to the channel layer (and persisted) at most this often, in seconds.
ARENA_DELTA_FLUSH_SECONDS = float(os.environ.get("ARENA_DELTA_FLUSH_SECONDS", "0.05"))
# Every reply appears at the same pace, whatever the model's speed (votes/pacing.py): no text
# before FIRST_TEXT_SECONDS, then at most CHARS_PER_S characters a second; 0 and 0: off.
ARENA_STREAM_CHARS_PER_S = float(os.environ.get("ARENA_STREAM_CHARS_PER_S", "250"))
ARENA_STREAM_FIRST_TEXT_SECONDS = float(os.environ.get("ARENA_STREAM_FIRST_TEXT_SECONDS", "0.3"))
# An anonymous battle is paced at MARGIN times what the slowest model anonymous battles may draw
# sustains (the 10th percentile of its own speeds on its last SAMPLE replies: MARGIN leaves room for
# its slower replies, whose pauses would show), UNMEASURED characters a
# second if it has none; a named or direct battle at its slower model's. An anonymous reply's
# pace starts no sooner than the longest typical time to first token (90th percentile of the last
# SAMPLE replies) of those models after its worker's start; on a turn to both sides each side's
# first text also waits (at most HOLD seconds) for the other's.
ARENA_STREAM_PACE_MARGIN = float(os.environ.get("ARENA_STREAM_PACE_MARGIN", "0.65"))
ARENA_STREAM_PACE_SAMPLE = int(os.environ.get("ARENA_STREAM_PACE_SAMPLE", "20"))
ARENA_STREAM_UNMEASURED_CHARS_PER_S = float(os.environ.get("ARENA_STREAM_UNMEASURED_CHARS_PER_S", "40"))
ARENA_STREAM_HOLD_SECONDS = float(os.environ.get("ARENA_STREAM_HOLD_SECONDS", "20"))
ARENA_PRESETS_DIR = Path(os.environ.get("ARENA_PRESETS_DIR", BASE_DIR / "inference" / "presets"))
# Real checkpoints imported by `manage.py import_checkpoint` (hundreds of MB each: never committed).
ARENA_IMPORTED_PRESETS_DIR = Path(os.environ.get("ARENA_IMPORTED_PRESETS_DIR", VAR_DIR / "presets"))

# Logs go to stderr, as plain text or (LOG_FORMAT=json) one JSON object a line, for a log
# collector: "time", "level", "logger", "message", and "exc_info" with a traceback.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text").strip().lower() or "text"
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT: {LOG_FORMAT!r} is neither 'text' nor 'json'.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601, UTC
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", **({"formatter": "json"} if LOG_FORMAT == "json" else {})}
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # One line per request to a model endpoint at INFO: every reply of a model served elsewhere.
    "loggers": {"httpx": {"level": "WARNING"}},
}
# Celery workers replace the root logger's handlers with their own (plain text) unless told not
# to: with JSON logs they keep the one above.
CELERY_WORKER_HIJACK_ROOT_LOGGER = LOG_FORMAT != "json"

# --- Operations: metrics and readiness (docs/operations.md) ----------------------------------------
# Who may read /metrics (web tier): these networks, asked directly (a request relayed by a
# proxy, one with X-Forwarded-For or Forwarded, is refused whatever its peer). By default
# loopback and the private ranges, where Prometheus runs beside the site; "none": nobody.
ARENA_METRICS_ALLOWED = [
    entry.strip()
    for entry in (
        os.environ.get("ARENA_METRICS_ALLOWED")
        or "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"
    ).split(",")
    if entry.strip()
]
if [entry.lower() for entry in ARENA_METRICS_ALLOWED] == ["none"]:
    ARENA_METRICS_ALLOWED = []
for _network in ARENA_METRICS_ALLOWED:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(
            f"ARENA_METRICS_ALLOWED: {_network!r} is not an IP address or network (e.g. 10.0.0.0/8)."
        ) from _exc
# Series labelled by model (tokens, replies, engines) name a battle's pair to a voter who scrapes
# before and after their battle: /metrics serves them only to a scraper that sends
# "Authorization: Bearer <this token>". Empty, the default: served to nobody (every other series is).
ARENA_METRICS_TOKEN = os.environ.get("ARENA_METRICS_TOKEN", "")
# Celery workers and inference hosts have no web server: with a port here each serves its own
# metrics on http://ADDRESS:PORT/metrics (arena_site.metrics). 0, the default: none.
ARENA_METRICS_PORT = int(os.environ.get("ARENA_METRICS_PORT", "0"))
ARENA_METRICS_ADDRESS = os.environ.get("ARENA_METRICS_ADDRESS", "0.0.0.0")
# Seconds each readiness check (/readyz: database, cache, Redis, broker) may take.
ARENA_READINESS_TIMEOUT_SECONDS = float(os.environ.get("ARENA_READINESS_TIMEOUT_SECONDS", "3"))

# --- Inference -----------------------------------------------------------------------------------
# Decode slots per model engine: how many replies of one model share a decode batch; and its
# prefix pool: prompt prefixes of up to TOKENS tokens kept on the device, ROWS of them (a dialog's
# next turn is prefilled from where its cached prefix ends). Both hold memory for every model
# (docs/models.md measures it): an inference host (REDIS_URL set) serves many voters at once,
# the embedded arena a few, on a laptop.
ARENA_ENGINE_SLOTS = int(os.environ.get("ARENA_ENGINE_SLOTS", "8" if REDIS_URL else "4"))
ARENA_PREFIX_CACHE_ROWS = int(os.environ.get("ARENA_PREFIX_CACHE_ROWS", "16" if REDIS_URL else "4"))
ARENA_PREFIX_CACHE_TOKENS = int(os.environ.get("ARENA_PREFIX_CACHE_TOKENS", "1024"))
# Compile prompt and decode lengths in powers of two only: about half the compiled programs, each
# of which holds memory of its own (docs/models.md), for a little padding. On by default in the
# embedded arena (a laptop), off on an inference host.
ARENA_ENGINE_COMPACT = env_bool("ARENA_ENGINE_COMPACT", not REDIS_URL)
# The dtype the engines keep keys and values in (slots, staging row, prefix pool): "float16"
# halves them for a float32 model, each key and value rounded once, as vLLM's kv_cache_dtype does
# (on a CPU Gemma 3's decode step 5-11 % slower, SmolLM2's up to 24 %; bfloat16 slower: docs/models.md);
# empty: the model's own dtype (greedy text then matches keras-hub's generate() exactly).
# float16 by default in the embedded arena (a laptop), the model's on an inference host.
ARENA_ENGINE_CACHE_DTYPE = float_dtype("ARENA_ENGINE_CACHE_DTYPE", "" if REDIS_URL else "float16")
# The dtype the engines keep a model's token embedding in (its lookup and, tied, its logits'
# matrix: most of a small model's weights; inference/engine/stored_dtype.py), for the families
# whose pass runs it at least as fast so (inference.forward.narrow_embedding_pays: Gemma 3):
# "bfloat16" halves it (Gemma 3 270M: 335 MB less) and speeds up its decode step on a CPU;
# empty: the model's own dtype. bfloat16 by default in the embedded arena (a laptop), the
# model's on an inference host.
ARENA_ENGINE_EMBEDDING_DTYPE = float_dtype("ARENA_ENGINE_EMBEDDING_DTYPE", "" if REDIS_URL else "bfloat16")
# Serve a model the project fine-tuned (a fixer) as a LoRA adapter in the engine of the model it
# was tuned from, when both are hosted by the same workers: one copy of the shared weights, one
# set of caches, and their replies decoded together (inference/hosts/engines.py). The
# identification probe runs on the roster served so (docs/security.md).
ARENA_FIXERS_AS_ADAPTERS = env_bool("ARENA_FIXERS_AS_ADAPTERS", True)
# A reply that runs longer than this is cancelled and marked failed (thread pools have no hard
# Celery time limit, so the generation service enforces it).
ARENA_GENERATION_TIMEOUT_SECONDS = float(os.environ.get("ARENA_GENERATION_TIMEOUT_SECONDS", "300"))
# Lost workers: a worker generating a reply touches its heartbeat every HEARTBEAT seconds (model
# loading included). A reply being generated whose heartbeat is older than STALL seconds, or one
# no worker has taken within QUEUE seconds, is failed with a clear error and a retry button
# (votes.services.fail_stalled_replies: on connect and sync, and every minute from beat).
ARENA_REPLY_HEARTBEAT_SECONDS = float(os.environ.get("ARENA_REPLY_HEARTBEAT_SECONDS", "5"))
ARENA_REPLY_STALL_SECONDS = float(os.environ.get("ARENA_REPLY_STALL_SECONDS", "30"))
ARENA_REPLY_QUEUE_SECONDS = float(os.environ.get("ARENA_REPLY_QUEUE_SECONDS", "300"))
# A reply keeps streaming while any page of its battle is open; once every page has been gone for
# ARENA_LEAVE_GRACE_SECONDS (a reload, a flaky network and a closed tab are told apart by it),
# its worker stops it. Open pages say so every third of that.
ARENA_LEAVE_GRACE_SECONDS = float(os.environ.get("ARENA_LEAVE_GRACE_SECONDS", "60"))
# A battle whose voter has voted and done nothing for this long ends by itself, so its votes
# count (the leaderboard's refresh check ends them; the names show when the voter comes back).
ARENA_BATTLE_IDLE_SECONDS = float(os.environ.get("ARENA_BATTLE_IDLE_SECONDS", "900"))
# The load test turns this on for its workers: frames they publish carry "sent_at" (Unix time),
# so that the voters can time the web tier. Off in production.
ARENA_TRACE_FRAMES = env_bool("ARENA_TRACE_FRAMES", False)
# Threads of the embedded mode's in-process worker: concurrent replies share each engine's batch.
ARENA_IN_PROCESS_WORKERS = int(os.environ.get("ARENA_IN_PROCESS_WORKERS", "8"))
# manage.py serve, asked to stop: how long its replies and evaluation runs get to end on their
# own before it ends them in the database and exits (votes.shutdown). The whole stop stays
# within 5 s.
ARENA_SHUTDOWN_GRACE_SECONDS = float(os.environ.get("ARENA_SHUTDOWN_GRACE_SECONDS", "2"))
ARENA_EVALUATION_QUEUE = os.environ.get("ARENA_EVALUATION_QUEUE", "evaluations")
# Models warm before the first voter (inference.readiness, inference.warming). Hosts report each
# model they serve as loading, ready or failed, again every third of ARENA_MODEL_STATE_TTL_SECONDS;
# a report older than that counts for nothing (its host stopped). Battles draw and voters pick
# only ready models (off: every enabled model, loaded at its first reply). The embedded arena
# warms its whole roster in the background from its start (off: at first use).
ARENA_MODEL_STATE_TTL_SECONDS = float(os.environ.get("ARENA_MODEL_STATE_TTL_SECONDS", "60"))
ARENA_READY_MODELS_ONLY = env_bool("ARENA_READY_MODELS_ONLY", True)
# Ready models an anonymous battle needs (or the whole anonymous roster where it is smaller):
# which models are ready is public, and with two ready every battle's pair would be known.
ARENA_MIN_READY_MODELS = int(os.environ.get("ARENA_MIN_READY_MODELS", "3"))
ARENA_WARM_AT_START = env_bool("ARENA_WARM_AT_START", True)
# Models served elsewhere (an OpenAI-compatible endpoint, inference.clients.openai_compatible):
# the Celery queue of the light workers that stream their replies (no Keras, no JAX), how long
# a connection may take and a silence in the stream may last, and the most a server may send
# for one reply (its answer is untrusted).
ARENA_ENDPOINT_QUEUE = os.environ.get("ARENA_ENDPOINT_QUEUE", "endpoints")
ARENA_ENDPOINT_CONNECT_TIMEOUT_SECONDS = float(os.environ.get("ARENA_ENDPOINT_CONNECT_TIMEOUT_SECONDS", "10"))
ARENA_ENDPOINT_READ_TIMEOUT_SECONDS = float(os.environ.get("ARENA_ENDPOINT_READ_TIMEOUT_SECONDS", "120"))
ARENA_ENDPOINT_MAX_RESPONSE_BYTES = int(os.environ.get("ARENA_ENDPOINT_MAX_RESPONSE_BYTES", str(2 * 1024 * 1024)))

# Research API and dumps. The judge pseudonym is an HMAC of the voter with this secret: keep it
# stable, or dumps stop being joinable across exports.
ARENA_JUDGE_SECRET = os.environ.get("ARENA_JUDGE_SECRET") or SECRET_KEY
ARENA_DUMP_DIR = Path(os.environ.get("ARENA_DUMP_DIR", str(BASE_DIR / "var" / "dumps")))
ARENA_API_ANON_PER_MINUTE = int(os.environ.get("ARENA_API_ANON_PER_MINUTE", "30"))
ARENA_API_KEY_PER_MINUTE = int(os.environ.get("ARENA_API_KEY_PER_MINUTE", "600"))
ARENA_API_SAMPLE_SIZE = int(os.environ.get("ARENA_API_SAMPLE_SIZE", "100"))
# Throttle counters must be shared by every web process: Redis when there is one.
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# Leaderboard: beat checks every minute and recomputes every category when the latest refresh
# is older than LEADERBOARD_REFRESH_SECONDS, or sooner once LEADERBOARD_REFRESH_VOTES new votes
# have arrived. A model with fewer votes than LEADERBOARD_PROVISIONAL_VOTES is "provisional".
LEADERBOARD_REFRESH_SECONDS = float(os.environ.get("LEADERBOARD_REFRESH_SECONDS", "600"))
LEADERBOARD_REFRESH_VOTES = int(os.environ.get("LEADERBOARD_REFRESH_VOTES", "100"))
LEADERBOARD_PROVISIONAL_VOTES = int(os.environ.get("LEADERBOARD_PROVISIONAL_VOTES", "30"))
LEADERBOARD_BOOTSTRAP_ROUNDS = int(os.environ.get("LEADERBOARD_BOOTSTRAP_ROUNDS", "1000"))
LEADERBOARD_ELO_K = float(os.environ.get("LEADERBOARD_ELO_K", "32"))
# Anomalous voters (leaderboard/anomaly.py), flagged at each refresh: Fisher's combined p-value
# of a voter's votes below ALPHA, or their choices of one model concentrated, over at least
# MIN_VOTES votes; an honest voter is flagged with probability at most FALSE_ALARMS (choices of
# a model under attack are judged at FALSE_ALARMS - 2 ALPHA, the rest at ALPHA). The same tests,
# all at ALPHA, run on the
# votes grouped by client network (Battle.network_key: /24 or /64), so that fresh sessions do not
# hide a campaign; a flagged network's voters whose votes there mostly chose its target are
# flagged with it (votes.FlaggedNetwork).
LEADERBOARD_ANOMALY_ALPHA = float(os.environ.get("LEADERBOARD_ANOMALY_ALPHA", "1e-4"))
LEADERBOARD_ANOMALY_FALSE_ALARMS = float(os.environ.get("LEADERBOARD_ANOMALY_FALSE_ALARMS", "0.01"))
LEADERBOARD_ANOMALY_MIN_VOTES = int(os.environ.get("LEADERBOARD_ANOMALY_MIN_VOTES", "5"))
# PostgreSQL's work_mem for the refresh's transaction alone: its aggregates over every vote then
# hash in memory instead of sorting on disk (4 MB, the server's default, halves their speed).
# Per-day vote caps (as FastChat's limit_user_votes): a voter key's and a network's (Battle.network_key)
# anonymous votes beyond these in a UTC day are stored and the voter sees nothing different, but the
# board leaves them out ("over daily cap"). A network can be a whole office or carrier NAT: larger.
# 0: no cap.
ARENA_VOTES_PER_VOTER_PER_DAY = int(os.environ.get("ARENA_VOTES_PER_VOTER_PER_DAY", "100"))
ARENA_VOTES_PER_NETWORK_PER_DAY = int(os.environ.get("ARENA_VOTES_PER_NETWORK_PER_DAY", "1000"))
LEADERBOARD_WORK_MEM = os.environ.get("LEADERBOARD_WORK_MEM", "64MB")
CELERY_BEAT_SCHEDULE = {
    # Models served elsewhere are ready while their server lists them (inference.readiness), asked
    # by the workers that hold their keys.
    "check-endpoints": {
        "task": "inference.check_endpoints",
        "schedule": ARENA_MODEL_STATE_TTL_SECONDS / 3,
        "options": {"queue": ARENA_ENDPOINT_QUEUE},
    },
    "fail-stalled-replies": {"task": "votes.fail_stalled_replies", "schedule": 60.0, "options": {"queue": "default"}},
    "refresh-leaderboard": {"task": "leaderboard.refresh_if_due", "schedule": 60.0, "options": {"queue": "default"}},
    "nightly-dump": {
        "task": "votes.export_dump",
        "schedule": crontab(hour=3, minute=0),
        "options": {"queue": "default"},
    },
    "purge-expired-sessions": {
        "task": "votes.purge_expired_sessions",
        "schedule": crontab(hour=3, minute=30),
        "options": {"queue": "default"},
    },
}
