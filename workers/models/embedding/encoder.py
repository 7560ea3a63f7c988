"""The all-MiniLM-L6-v2 forward on torch: a compact BERT encoder plus mean pooling.

Written here instead of ``transformers.BertModel``: fused QKV, no per-call mask
bookkeeping, and every op is graph-capturable (graphs.py). Mean pooling over real
tokens (as sentence-transformers' Pooling module does), accumulated in fp32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # fp16 keeps more mantissa than bf16 and this small encoder stays in its range.
        return torch.float16 if device.type == "cuda" else torch.float32
    table = {
        "fp16": torch.float16,
        "float16": torch.float16,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; use auto, fp16, bf16 or fp32")
    return table[name]


@dataclass
class _Layer:
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    o_w: torch.Tensor
    o_b: torch.Tensor
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    i_w: torch.Tensor
    i_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor


class Encoder:
    """BERT forward plus mean pooling, inference only. ``(ids, lens) -> [b, hidden] fp32``."""

    def __init__(self, model_dir: Path, device: torch.device, dtype: torch.dtype):
        cfg = json.loads((model_dir / "config.json").read_text())
        if (
            cfg.get("hidden_act", "gelu") != "gelu"
            or cfg.get("position_embedding_type", "absolute") != "absolute"
        ):
            raise ValueError("only BERT encoders with gelu and absolute positions are supported")
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.max_positions = int(cfg["max_position_embeddings"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.dtype = dtype
        self.device = device
        raw = load_file(str(model_dir / "model.safetensors"))
        sd = {k.removeprefix("bert."): v for k, v in raw.items()}

        def w(name: str) -> torch.Tensor:
            return sd[name].to(device=device, dtype=dtype).contiguous()

        self.word = w("embeddings.word_embeddings.weight")
        # Token type is always 0 for single sentences: fold it into the positions once.
        pos = sd["embeddings.position_embeddings.weight"].float()
        typ = sd["embeddings.token_type_embeddings.weight"][0].float()
        self.pos_type = (pos + typ).to(device=device, dtype=dtype).contiguous()
        self.emb_ln_w = w("embeddings.LayerNorm.weight")
        self.emb_ln_b = w("embeddings.LayerNorm.bias")
        self.layers: list[_Layer] = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            self.layers.append(
                _Layer(
                    # One GEMM for Q, K and V instead of three launches.
                    qkv_w=torch.cat([sd[a + n + ".weight"] for n in ("query", "key", "value")])
                    .to(device=device, dtype=dtype)
                    .contiguous(),
                    qkv_b=torch.cat([sd[a + n + ".bias"] for n in ("query", "key", "value")])
                    .to(device=device, dtype=dtype)
                    .contiguous(),
                    o_w=w(p + "attention.output.dense.weight"),
                    o_b=w(p + "attention.output.dense.bias"),
                    ln1_w=w(p + "attention.output.LayerNorm.weight"),
                    ln1_b=w(p + "attention.output.LayerNorm.bias"),
                    i_w=w(p + "intermediate.dense.weight"),
                    i_b=w(p + "intermediate.dense.bias"),
                    out_w=w(p + "output.dense.weight"),
                    out_b=w(p + "output.dense.bias"),
                    ln2_w=w(p + "output.LayerNorm.weight"),
                    ln2_b=w(p + "output.LayerNorm.bias"),
                )
            )

    def __call__(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        h, nh = self.hidden, self.heads
        x = F.embedding(ids, self.word) + self.pos_type[:s]
        x = F.layer_norm(x, (h,), self.emb_ln_w, self.emb_ln_b, self.eps)
        keep = torch.arange(s, device=ids.device)[None, :] < lens[:, None]  # [b, s]
        # Additive bias rather than a bool mask: a fully masked row cannot produce NaN.
        bias = torch.zeros((b, 1, 1, s), dtype=self.dtype, device=ids.device)
        bias.masked_fill_(~keep[:, None, None, :], torch.finfo(self.dtype).min)
        for p in self.layers:
            qkv = F.linear(x, p.qkv_w, p.qkv_b).view(b, s, 3, nh, h // nh).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=bias)
            a = a.transpose(1, 2).reshape(b, s, h)
            x = F.layer_norm(F.linear(a, p.o_w, p.o_b) + x, (h,), p.ln1_w, p.ln1_b, self.eps)
            y = F.linear(F.gelu(F.linear(x, p.i_w, p.i_b)), p.out_w, p.out_b)
            x = F.layer_norm(y + x, (h,), p.ln2_w, p.ln2_b, self.eps)
        # Mean over real tokens, summed in fp32 so fp16 rounding does not accumulate.
        m = keep.unsqueeze(-1).to(torch.float32)
        return (x.float() * m).sum(1) / lens.clamp(min=1).unsqueeze(-1).to(torch.float32)
