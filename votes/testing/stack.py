"""A real arena stack on loopback: daphne and Celery workers as child processes.

The load test (manage.py loadtest) and the fault and browser tests run the arena the way
production does, in processes of their own that share this process's database and Redis;
killing or restarting those processes is how the tests make parts fail.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings

READY_TIMEOUT_SECONDS = 900.0  # an inference host compiling every shape takes minutes
POLL_SECONDS = 0.1


class StackError(RuntimeError):
    """A child process would not start; the message quotes the end of its log."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def database_url(settings_dict: dict[str, Any]) -> str:
    """The URL of a Django database (the test database, in tests) for a child process."""
    if settings_dict["ENGINE"] != "django.db.backends.postgresql":
        raise StackError("A stack of several processes needs PostgreSQL (set DATABASE_URL).")
    user = quote(settings_dict.get("USER") or "")
    password = settings_dict.get("PASSWORD") or ""
    credentials = f"{user}:{quote(password)}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{credentials}{host}:{port}/{settings_dict['NAME']}"


def _die_with_parent(args: list[str]) -> list[str]:
    """The command, made to get SIGKILL when the process that started it dies (util-linux's
    setpriv, where there is one), so that an interrupted test run leaves no server holding the
    test database. Not a preexec_fn: Python code between fork and exec can deadlock beside
    JAX's threads."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the whole process group: no clean shutdown, as when a host dies."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Stack:
    """Child processes sharing one environment: DATABASE_URL, REDIS_URL and any overrides
    (both empty: the embedded arena)."""

    database_url: str
    redis_url: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)

    def child_env(self) -> dict[str, str]:
        """The children's environment. An empty database and Redis URL give the embedded
        arena (SQLite in ARENA_VAR_DIR, in-memory channel layer, in-process worker), as
        scripts/serve runs it."""
        env = dict(os.environ)
        for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
            env.pop(name, None)
        if self.database_url:
            env["DATABASE_URL"] = self.database_url
        if self.redis_url:
            env.update(REDIS_URL=self.redis_url, CELERY_BROKER_URL=self.redis_url)
        env.update(
            DJANGO_SETTINGS_MODULE="arena_site.settings",
            KERAS_BACKEND="jax",
            SECRET_KEY=settings.SECRET_KEY,
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        return env

    def spawn(self, name: str, args: list[str]) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                _die_with_parent(args),
                cwd=settings.BASE_DIR,
                env=self.child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one
            )
        child = Child(name=name, process=process, log=log)
        self.children.append(child)
        return child

    def start_worker(
        self, name: str, queues: list[str], concurrency: int = 8, cpus: str | None = None, warm_up: bool = False
    ) -> Child:
        """A Celery worker with a thread pool, as on an inference host; returns once it is ready.

        Without ``warm_up`` it loads each model at its first reply; with it, it is started as
        production's inference hosts are (manage.py run_inference_host: every shape compiled
        before the worker takes jobs, which takes minutes). ``cpus`` pins it to those cores
        (taskset), as if it ran on a host of its own."""
        pin = ["taskset", "--cpu-list", cpus] if cpus else []
        if warm_up:
            command = [sys.executable, "manage.py", "run_inference_host", "--queues", ",".join(queues)]
            command += ["--concurrency", str(concurrency)]
        else:
            command = [
                sys.executable, "-m", "celery", "-A", "arena_site", "worker",
                "--pool", "threads", "--concurrency", str(concurrency),
                "--queues", ",".join(queues), "--hostname", f"{name}@%h",
                "--without-gossip", "--without-mingle", "--loglevel", "INFO",
            ]  # fmt: skip
        child = self.spawn(name, [*pin, *command])
        self.wait_until(child, lambda: " ready." in child.log.read_text(errors="replace"))
        return child

    def start_web(self, name: str = "web", port: int | None = None) -> tuple[Child, str]:
        """Daphne on loopback; returns the child and its base URL once it accepts connections."""
        port = port or free_port()
        child = self.spawn(
            name, [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "arena_site.asgi:application"]
        )
        self.wait_until(child, lambda: _port_open(port))
        return child, f"http://127.0.0.1:{port}"

    def wait_until(self, child: Child, ready: Any, timeout_s: float = READY_TIMEOUT_SECONDS) -> None:
        """Until ``ready()`` is true; raises ``StackError`` with the end of the child's log if it
        exits first or ``timeout_s`` pass (the child is then killed)."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if child.process.poll() is not None:
                raise StackError(f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}")
            if time.monotonic() > deadline:
                child.kill()
                raise StackError(f"{child.name} not ready within {timeout_s:.0f} s:\n{child.log_tail()}")
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children.clear()


class RedisServer:
    """A redis-server of its own on a free port, which a test can restart without touching the
    machine's Redis (nothing persisted: a restart loses every key, as in compose.yaml)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            _die_with_parent([
                "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", str(self.log_dir),
                "--logfile", str(self.log_dir / f"redis-{self.port}.log"),
            ]),
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise StackError(f"redis-server on port {self.port} did not start")
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()
