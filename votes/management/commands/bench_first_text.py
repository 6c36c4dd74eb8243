"""python manage.py bench_first_text [--url http://127.0.0.1:8000] [--battles 5] [--json FILE]"""

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from votes import bench_first_text, selectors


class Command(BaseCommand):
    help = (
        "How long a voter waits for text on a running arena (scripts/serve): chromium plays battles "
        "one after another, each a new voter, once every model anonymous battles draw is ready, and "
        "reports the seconds from Send to the first text on either side and on both, and to both "
        "replies finished (median, 90th percentile, max)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="The arena (default: scripts/serve's).")
        parser.add_argument("--battles", type=int, default=5)
        parser.add_argument("--prompt", default=bench_first_text.PROMPT)
        parser.add_argument(
            "--ready-timeout", type=float, default=900, help="Seconds to wait for the roster to be ready."
        )
        parser.add_argument(
            "--chromium",
            default=os.environ.get("ARENA_CHROMIUM", "/usr/bin/chromium"),
            help="The chromium to drive (Debian's; ARENA_CHROMIUM).",
        )
        parser.add_argument("--json", type=Path, help="Also write the report to this file.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["battles"] < 1:
            raise CommandError("--battles must be at least 1.")
        if not Path(options["chromium"]).exists():
            raise CommandError(f"{options['chromium']} is missing: install chromium (apt-get install chromium).")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=options["chromium"], args=["--no-sandbox"])
            try:
                report = bench_first_text.measure(
                    options["url"],
                    options["battles"],
                    browser=browser,
                    prompt=options["prompt"],
                    ready_timeout_s=options["ready_timeout"],
                )
            except (bench_first_text.NotReady, bench_first_text.BattleFailed) as error:
                raise CommandError(str(error)) from error
            finally:
                browser.close()
        # After the browser: Playwright's loop is gone, and the database may be read.
        report = report.with_model_times(selectors.slower_generation_seconds, selectors.slowest_model_seconds)
        for index, battle in enumerate(report.battles, 1):
            self.stdout.write(
                f"battle {index}: first text {battle.first_side_s:.2f} s, both sides {battle.both_sides_s:.2f} s, "
                f"both finished {battle.finished_s:.1f} s"
                + (f", {battle.over_slower_model:.2f}x the slower model's own time" if battle.over_slower_model else "")
                + (
                    f", {battle.over_slowest_model:.2f}x what the slowest drawable model needs"
                    if battle.over_slowest_model
                    else ""
                )
            )
        labels = {
            "first_side_s": "first text",
            "both_sides_s": "text on both",
            "finished_s": "both finished",
            "over_slower_model": "both finished over the slower model's own time",
            "over_slowest_model": "both finished over what the slowest drawable model needs",
        }
        summary = report.summary()
        for field, label in labels.items():
            if field not in summary:
                self.stdout.write(f"{label}: not known (the arena's database is not this process's)")
                continue
            figures = summary[field]
            unit = " s" if field.endswith("_s") else "x"
            self.stdout.write(
                f"{label}: median {figures['median']:.2f}{unit}, p90 {figures['p90']:.2f}{unit}, "
                f"max {figures['max']:.2f}{unit} ({len(report.battles)} battles)"
            )
        if options["json"]:
            options["json"].write_text(json.dumps(report.as_dict(), indent=2))
