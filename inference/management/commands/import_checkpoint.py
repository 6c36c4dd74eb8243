from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.building.checkpoints import DEFAULT_CONTEXT, CheckpointError, import_checkpoint
from inference.chat_templates import FAMILIES


class Command(BaseCommand):
    help = (
        "Import a real pretrained checkpoint as a keras-hub preset: a GGUF file, an installed Python "
        "package that ships one (by distribution name), or a Hugging Face-layout folder."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", help="GGUF file, Hugging Face folder, or installed distribution name.")
        parser.add_argument("--name", required=True, help="Name of the preset folder (and of the roster entry).")
        parser.add_argument(
            "--out", type=Path, default=settings.ARENA_IMPORTED_PRESETS_DIR, help="Folder the preset is written to."
        )
        parser.add_argument("--sha256", help="Expected sha256 of the GGUF file (or model.safetensors).")
        parser.add_argument("--license", help="Licence to record when the checkpoint does not state one.")
        parser.add_argument("--template", choices=FAMILIES, help="Chat template family, instead of the detected one.")
        parser.add_argument("--replace", action="store_true", help="Replace a preset of the same name.")
        parser.add_argument(
            "--hugging-face-out",
            type=Path,
            help="Also keep the Hugging Face layout a GGUF file is converted through, in this folder: what vLLM "
            "serves the same weights from.",
        )
        parser.add_argument(
            "--context",
            type=int,
            default=DEFAULT_CONTEXT,
            help=f"Tokens of prompt plus reply (default {DEFAULT_CONTEXT}; at most the checkpoint's own).",
        )

    def handle(self, *args: object, **options: object) -> None:
        out = Path(str(options["out"]))
        try:
            imported = import_checkpoint(
                str(options["source"]),
                str(options["name"]),
                out,
                sha256=options["sha256"],  # type: ignore[arg-type]
                license=options["license"],  # type: ignore[arg-type]
                template=options["template"],  # type: ignore[arg-type]
                replace=bool(options["replace"]),
                context=int(options["context"]),  # type: ignore[call-overload]
                hugging_face_dir=options["hugging_face_out"],  # type: ignore[arg-type]
                report=lambda line: self.stdout.write(f"  {line}"),
            )
        except CheckpointError as error:
            raise CommandError(str(error)) from error
        kind = "base model" if imported.base else "chat model"
        self.stdout.write(
            f"Imported {imported.name} -> {out / imported.name}: {imported.architecture}, {imported.parameters:,} "
            f"parameters, {kind}, template {imported.template}, context {imported.context}, "
            f"licence {imported.license}, sha256 {imported.sha256}"
        )
