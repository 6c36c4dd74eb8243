"""python manage.py add_endpoint_model NAME --url BASE_URL --served-model MODEL [--api-key-env VAR]"""

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import services
from inference.clients.openai_compatible import EndpointError
from inference.models import CONTEXT_NOTE, DEFAULT_SAMPLING, Family


class Command(BaseCommand):
    help = (
        "Add a model served by an OpenAI-compatible server (vLLM, llama.cpp, a hosted API, another arena host) to "
        "the roster, or update its entry. The server is asked for its model list first: the served model must be "
        "on it, and its context length is taken from it where the server gives one (vLLM does)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The roster name, revealed to voters after their vote.")
        parser.add_argument("--url", required=True, help='The API root, e.g. "http://vllm:8000/v1".')
        parser.add_argument("--served-model", required=True, help='The name the server serves it under ("model").')
        parser.add_argument(
            "--api-key-env",
            default="",
            help='The environment variable of the generation workers holding the API key, e.g. "VLLM_API_KEY".',
        )
        parser.add_argument("--context-tokens", type=int, help="Its context length (default: what the server says).")
        parser.add_argument(
            "--family",
            default="",
            choices=["", *Family.values],
            help="Its chat template family: needed with --arena-template, and trims the family's habitual prefix.",
        )
        parser.add_argument(
            "--arena-template",
            action="store_true",
            help="The arena renders the prompt with --family's template and sends a plain completion (/completions), "
            "instead of messages the server applies its own template to.",
        )
        parser.add_argument("--base", action="store_true", help="A pretrained base model, not tuned to chat.")
        parser.add_argument("--temperature", type=float, default=DEFAULT_SAMPLING["temperature"])
        parser.add_argument("--top-p", type=float, default=DEFAULT_SAMPLING["top_p"])
        parser.add_argument("--top-k", type=int, default=DEFAULT_SAMPLING["top_k"])
        parser.add_argument("--max-new-tokens", type=int, default=96)
        parser.add_argument("--disabled", action="store_true", help="Add it without letting battles draw it yet.")
        parser.add_argument("--no-check", action="store_true", help="Do not ask the server for its model list.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            model, created = services.save_endpoint_model(
                options["name"],
                url=options["url"],
                served_model=options["served_model"],
                api_key_env=options["api_key_env"],
                context_tokens=options["context_tokens"],
                family=options["family"],
                server_applies_template=not options["arena_template"],
                base=options["base"],
                enabled=not options["disabled"],
                sampling={"temperature": options["temperature"], "top_p": options["top_p"], "top_k": options["top_k"]},
                max_new_tokens=options["max_new_tokens"],
                check=not options["no_check"],
            )
        except ValidationError as error:
            problems = "; ".join(f"{field}: {' '.join(texts)}" for field, texts in error.message_dict.items())
            raise CommandError(f"Not saved: {problems}") from None
        except EndpointError as error:
            raise CommandError(f"Not saved: {error} (--no-check saves it without asking the server)") from None
        where = f"{model.endpoint_url} as {model.served_model!r}"
        self.stdout.write(
            f"{'Added' if created else 'Updated'} {model.name}: served by {where}, {model.context_tokens:,}-token "
            f"context, queue {model.queue}{'' if model.enabled else ' (disabled)'}"
        )
        if not model.fits_arena:
            self.stdout.write(self.style.WARNING(f"Anonymous battles will not draw it: {CONTEXT_NOTE}"))
