"""Write a dated dump of every vote for researchers (see votes.dumps)."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from votes import research
from votes.dumps import export_dump


class Command(BaseCommand):
    help = "Write <out>/<date>/ with votes.jsonl.gz, votes.csv.gz (and votes.parquet with pyarrow) and a dataset card."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default=str(settings.ARENA_DUMP_DIR), help="Folder (default ARENA_DUMP_DIR).")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CommandError(f"Cannot create {out}: {error.strerror}.") from None
        with tqdm(total=research.all_votes().count(), desc="votes", unit="vote", file=self.stderr) as bar:
            folder = export_dump(out, progress=bar.update)
        self.stdout.write(f"Wrote {folder}")
