"""python manage.py run_inference_host [--models a,b | --queues model.a,model.b] [--serve [--port P]]"""

import time
from typing import Any

from celery.signals import worker_shutting_down
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from arena_site.celery import app as celery_app
from inference import selectors, services, warming
from inference.hosts import engines


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


class Command(BaseCommand):
    help = (
        "Start an inference host: load each model once (sharded over all local devices), compile "
        "every shape its engine uses, report ready, then consume the models' Celery queues with a "
        "thread pool so that concurrent replies share each model's decode batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--models", help="Comma-separated roster names (default: every enabled model).")
        parser.add_argument("--queues", help="Comma-separated Celery queues, instead of --models.")
        parser.add_argument(
            "--concurrency", type=int, help="Worker threads (default: decode slots x number of models)."
        )
        parser.add_argument("--loglevel", default="INFO")
        parser.add_argument("--warm-up-only", action="store_true", help="Load and compile, report, then exit.")
        parser.add_argument(
            "--serve",
            action="store_true",
            help="Serve the models over the OpenAI-compatible protocol (/v1/chat/completions, /v1/models, /health) "
            "instead of consuming Celery queues: the roster then points entries at this host's URL.",
        )
        parser.add_argument("--bind", default="127.0.0.1", help="With --serve: the address to listen on.")
        parser.add_argument("--port", type=int, default=8100, help="With --serve: the port.")
        parser.add_argument(
            "--evaluations",
            action="store_true",
            help="Also run evaluation runs (the ARENA_EVALUATION_QUEUE queue); host every model they use.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            models = selectors.models_for_host(names=_split(options["models"]), queues=_split(options["queues"]))
        except ValueError as error:
            raise CommandError(str(error)) from error
        if not models:
            raise CommandError("No enabled models to host; add some in the admin or run register_demo_models.")
        if options["serve"]:
            from inference.hosts.openai_server import Host, HostedModel, serve

            host = Host([HostedModel(services.model_spec(model)) for model in models])
            if options["warm_up_only"]:
                host.warm_up(self.stdout.write)
                engines.shutdown_all()
                return
            serve(host, bind=options["bind"], port=options["port"], log_level=options["loglevel"].lower())
            return
        for model in models:
            started = time.monotonic()
            engine = engines.warm_up(services.model_spec(model))
            self.stdout.write(
                f"{model.name}: loaded and compiled in {time.monotonic() - started:.1f} s "
                f"({engine.compilations} compilations, {settings.ARENA_ENGINE_SLOTS} slots), queue {model.queue}"
            )
        queues = sorted({model.queue for model in models})
        if options["evaluations"]:
            queues.append(settings.ARENA_EVALUATION_QUEUE)
        self.stdout.write(self.style.SUCCESS(f"Inference host ready on {', '.join(queues)}"))
        if options["warm_up_only"]:
            engines.shutdown_all()
            return
        # The web tier draws these models from now on, while this host says so (inference.readiness).
        warmer = warming.Warmer(lambda: models, warm=False, check_endpoints=False).start()
        worker_shutting_down.connect(lambda **kwargs: warmer.stop(), weak=False)
        concurrency = options["concurrency"] or settings.ARENA_ENGINE_SLOTS * len(models)
        celery_app.worker_main(
            [
                "worker",
                "--queues",
                ",".join(queues),
                "--pool",
                "threads",
                "--concurrency",
                str(concurrency),
                "--hostname",
                "inference@%h",
                "--loglevel",
                options["loglevel"],
            ]
        )
