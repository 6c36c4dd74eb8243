"""Serve the arena with daphne, and stop within seconds when asked (Ctrl-C or SIGTERM).

``daphne arena_site.asgi:application`` alone does not stop while the embedded mode's threads
are writing a reply or running an evaluation: Python waits for them at exit. This runs the same
daphne (its own command line, so every daphne option and default is the same) and, as soon as
daphne stops taking connections, has those threads stop (``votes.shutdown``).
"""

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from inference import model_process, warming
from votes import shutdown


class Command(BaseCommand):
    help = (
        "Serve the arena (daphne) on HOST:PORT. Ctrl-C or SIGTERM stops it within seconds: replies "
        "being written end as stopped, evaluation runs as interrupted (the admin can run them again)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
        parser.add_argument("--port", type=int, default=8000, help="Port to listen on (default 8000).")
        parser.add_argument(
            "--grace",
            type=float,
            default=settings.ARENA_SHUTDOWN_GRACE_SECONDS,
            help="Seconds the work in flight gets to end on its own once asked to stop (ARENA_SHUTDOWN_GRACE_SECONDS).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from daphne.cli import CommandLineInterface  # Installs Twisted's asyncio reactor first.
        from twisted.internet import reactor

        # This process serves models: Keras without the test-only packages (77 MB;
        # inference.model_process), marked before the warmer imports it.
        model_process.prepare()
        # The embedded arena loads and compiles its roster in the background from now on; its
        # pages say which models are ready (inference.warming).
        warmer = warming.start_embedded(should_stop=shutdown.stopping)
        # Before daphne closes its connections: the threads start stopping at once.
        reactor.addSystemEventTrigger("before", "shutdown", shutdown.begin)
        # Twisted handles SIGINT only where Python's own handler is in place; a process started
        # in the background by a shell ignores it (nohup, `&`), and Ctrl-C must still stop it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        CommandLineInterface().run(
            ["--bind", options["host"], "--port", str(options["port"]), "arena_site.asgi:application"]
        )
        stopped = shutdown.finish(options["grace"])
        if warmer is not None:
            warmer.stop()
        if stopped.unfinished_jobs or stopped.engines_running or (warmer is not None and warmer.busy):
            # A thread that cannot be interrupted (a model loading or compiling, a decode step)
            # would hold the exit or abort it; everything it wrote is saved and its reply ended above.
            from inference import services as inference_services

            inference_services.exit_now(0)
