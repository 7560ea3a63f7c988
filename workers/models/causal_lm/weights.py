"""The shipped weights: fp16 tensors plus a manifest (shape, training record, sha256).

Shipped in the repository rather than trained at install time (decision 23): 3.0 MB,
bit-identical on every machine (training on another CPU or torch version gives other
floats, so other greedy text), and an install costs no CPU minutes.
``python -m workers.models.causal_lm.train`` rebuilds them from the shipped corpus.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from workers.models.causal_lm.config import LMConfig
from workers.models.causal_lm.corpus import DATA_DIR
from workers.models.causal_lm.model import CausalLM

WEIGHTS_PATH = DATA_DIR / "weights.pt"
MANIFEST_PATH = DATA_DIR / "manifest.json"


class WeightsError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save(
    model: CausalLM,
    record: dict[str, Any],
    weights: Path = WEIGHTS_PATH,
    manifest: Path = MANIFEST_PATH,
) -> None:
    state = {k: v.detach().to(torch.float16).cpu() for k, v in model.state_dict().items()}
    torch.save(state, weights)
    body = {"config": model.cfg.to_dict(), "sha256": sha256(weights), "training": record}
    manifest.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def load(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    weights: Path = WEIGHTS_PATH,
    manifest: Path = MANIFEST_PATH,
) -> CausalLM:
    """The model in eval mode, its weights checked against the manifest's sha256."""
    meta = json.loads(manifest.read_text())
    digest = sha256(weights)
    if digest != meta["sha256"]:
        raise WeightsError(f"{weights} has sha256 {digest}, manifest says {meta['sha256']}")
    model = CausalLM(LMConfig.from_dict(meta["config"]))
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return model.to(device=device, dtype=dtype).eval()


def perturb(model: CausalLM, seed: int, noise: float) -> CausalLM:
    """Another set of weights from a seed (decision 67): each floating tensor plus
    Gaussian noise of ``noise`` times its own standard deviation, drawn on the CPU from
    ``seed`` alone, so every machine makes the same version."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.state_dict(keep_vars=True).items()):
            if not p.is_floating_point() or p.numel() < 2:
                continue
            draw = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            spread = float(p.detach().float().std())
            p.add_((draw * noise * spread).to(device=p.device, dtype=p.dtype))
    return model


def load_version(
    artifact: str,
    seed: int | None,
    noise: float,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CausalLM:
    """A registered version's weights: its artifact folder (``weights.pt`` and
    ``manifest.json``, as train.py writes them), else the packaged weights, perturbed
    when it names a seed."""
    if artifact:
        folder = Path(artifact)
        return load(device, dtype, folder / WEIGHTS_PATH.name, folder / MANIFEST_PATH.name)
    if seed is None:
        return load(device, dtype)
    return perturb(load("cpu", torch.float32), seed, noise).to(device=device, dtype=dtype)


def manifest() -> dict[str, Any]:
    return dict(json.loads(MANIFEST_PATH.read_text()))
