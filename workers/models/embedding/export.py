"""A second real version of the embedding model: the packaged weights stored in fp16.

``all-minilm-l6-v2@2`` is the same network with every floating-point weight rounded to
half precision and stored so (45 MB instead of 91 MB). A worker loads it like the
packaged version (casting to its runtime dtype: fp32 on a CPU, fp16 on CUDA), so on a
CPU its embeddings differ from version 1's by the rounding of the weights alone: a
cosine similarity of at least 0.999999 over 190 lines of the README, not bit-equal
(measured, docs/models.md). It has its own files,
hence its own sha256, which the registry pins.

    gristmill models export-embedding DIR        # writes DIR, prints its sha256

The directory holds what the runtime reads (config.json, model.safetensors,
tokenizer.json) and ``export.json``, which names the source's digest and the dtype.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from core.models.artifact import artifact_sha256
from core.models.text_tokenizer import model_files_dir

COPIED = ("config.json", "tokenizer.json")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def export(out: Path, *, dtype: str = "fp16", source: str = "") -> str:
    """Write the weights of ``source`` (default: the packaged model) as ``dtype`` into
    ``out``; returns the new artifact's sha256."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    src = Path(model_files_dir(source or None))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; export into a new directory")
    weights = load_file(str(src / "model.safetensors"))
    cast = {
        k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
        for k, v in weights.items()
    }
    save_file(cast, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in COPIED:
        shutil.copyfile(src / name, out / name)
    (out / "export.json").write_text(
        json.dumps({"source_sha256": artifact_sha256(src), "dtype": dtype}, indent=1) + "\n"
    )
    return artifact_sha256(out)
