"""Load a preset sharded over all local devices and print how one decoder block was split.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python manage.py print_shardings --preset inference/presets/gemma-calendar --family gemma --mesh 2,4

XLA_FLAGS (simulated CPU devices) is read once, when jax initialises: it must be in the
environment when the process starts. That works for this command because neither the settings
nor the apps import jax; setting it from inside the command would be too late once anything
had imported jax.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from inference.chat_templates import FAMILIES


def _mesh_shape(text: str) -> tuple[int, int]:
    try:
        batch, model = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCH,MODEL (e.g. 1,8), got {text!r}") from None
    return batch, model


class Command(BaseCommand):
    help = (
        "Load a preset with its weights sharded over all local devices and print path, shape and "
        "sharding spec of the token embedding and the first decoder block. Simulate devices on a "
        "CPU with XLA_FLAGS=--xla_force_host_platform_device_count=8 in the environment."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--preset", required=True, help="Preset folder, kaggle:// or hf:// handle.")
        parser.add_argument("--family", required=True, choices=FAMILIES)
        parser.add_argument(
            "--mesh", type=_mesh_shape, default=None, help="BATCH,MODEL mesh shape (default 1,<devices>)."
        )
        parser.add_argument("--dtype", default=None, help="Weights dtype, e.g. float32 or bfloat16.")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference.hosts import sharding  # Imports keras/jax: only when the command runs.

        try:
            mesh = sharding.mesh_for(options["mesh"])
            lm = sharding.load_sharded_causal_lm(
                options["preset"], family=options["family"], mesh_shape=options["mesh"], dtype=options["dtype"]
            )
        except sharding.ShardingError as error:
            raise CommandError(str(error)) from error
        rows = [(path, str(shape), spec) for path, shape, spec in sharding.describe_block_shardings(lm)]
        self.stdout.write(
            f"{type(lm.backbone).__name__} ({lm.backbone.dtype_policy.name}) on {sharding.device_count()} "
            f"devices, mesh {dict(zip(mesh.axis_names, mesh.shape, strict=True))}"
        )
        header = ("variable", "shape", "sharding")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
        for row in [header, tuple("-" * w for w in widths), *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
