"""Copy all-MiniLM-L6-v2 into .modelcache/ with fp16 weights, to carry to a GPU machine.

The packaged fp32 safetensors (87 MiB) is over the device tool's 64 MiB carry limit; fp16
halves it, and CUDA runs in fp16 anyway. The CPU reference on that machine then reads the
same fp16-rounded weights, so CUDA-vs-CPU comparisons there stay like for like.

    .venv/bin/python bench/gpu/prepare_weights.py   # -> .modelcache/all-minilm-l6-v2
    echo /.modelcache/ >> .git/info/exclude
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from core.models.text_tokenizer import model_files_dir

FILES = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".modelcache/all-minilm-l6-v2")
    out = Path(ap.parse_args().out)
    src = model_files_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    shutil.copytree(src / "1_Pooling", out / "1_Pooling", dirs_exist_ok=True)
    (out / "2_Normalize").mkdir(exist_ok=True)  # sentence-transformers expects the folder
    sd = load_file(str(src / "model.safetensors"))
    half = {
        k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in sd.items()
    }
    save_file(half, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) >> 20} MiB)")


if __name__ == "__main__":
    main()
