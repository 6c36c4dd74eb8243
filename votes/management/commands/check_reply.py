"""Judge one reply with an automatic checker and print the verdict as JSON."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from votes.checkers import CHECKER_KINDS, CheckerConfigError, check


class Command(BaseCommand):
    help = (
        "Judge a reply against an expected output and print {verdict, reason, mistakes} as JSON. "
        "Example: check_reply --kind python_call --expected 'f(1, b=\"x\")' --reply \"f(1, 'x')\" "
        '--signature "f(a, b)"'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", required=True, choices=CHECKER_KINDS, help="The checker to use.")
        parser.add_argument("--expected", required=True, help="The expected output (a pattern for regex).")
        parser.add_argument("--reply", required=True, help="The reply to judge.")
        parser.add_argument(
            "--signature",
            action="append",
            default=[],
            help='python_call: an API function, e.g. "action.remove_calendar_entry(title, date, time)"; repeatable.',
        )
        parser.add_argument("--options", default="{}", help="Further checker options, as a JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            checker_options = json.loads(options["options"])
        except ValueError as error:
            raise CommandError(f"--options is not valid JSON: {error}.") from None
        if not isinstance(checker_options, dict):
            raise CommandError("--options must be a JSON object.")
        if options["signature"]:
            if options["kind"] != "python_call":
                raise CommandError("--signature applies to --kind python_call only.")
            checker_options["signature"] = options["signature"]
        try:
            result = check(options["kind"], options["expected"], options["reply"], checker_options)
        except CheckerConfigError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(json.dumps(result.as_dict(), ensure_ascii=False))
