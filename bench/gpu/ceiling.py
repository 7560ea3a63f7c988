"""all-minilm-l6-v2 on one GPU: raw ceiling, CPU-side costs and the worker's predict path.

Writes one JSON file (see bench/gpu/README.md); bench/gpu/plot.py draws the charts.

    python bench/gpu/ceiling.py --model-dir .modelcache/all-minilm-l6-v2 --out gpu_bench.json

Sections (each saved as soon as it is done, so a timeout keeps what ran):
  env        GPU, driver, torch, CPU count
  check      fp16 CUDA vs fp32 CPU (and sentence-transformers when installed)
  ceiling    the encoder alone on ready GPU tensors: ms per batch by batch size and
             sequence length, eager and CUDA-graph replay; transformers' BertModel for reference
  cpu        tokenization (one call per text vs one call per batch), packing, tolist,
             pickle, host-to-device copies (pageable vs pinned), padding waste
  predict    EmbeddingModel.predict on a mixed 8..128 token workload, with ablations
  warmup     the worker's own warmup profile and peak GPU memory per batch size
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pickle
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.config import Settings
from core.models.embedding import EmbedSpec
from core.models.text_tokenizer import load_tokenizer
from workers.models.embedding.encoder import Encoder
from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime
from workers.models.embedding.warmup import synthetic_texts

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
SEQS = [16, 32, 64, 128, 256]


def cuda_time(fn: Callable[[], Any], min_ms: float = 25.0, groups: int = 5) -> float:
    """Median ms per call, timed with CUDA events over groups of back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    k = max(1, math.ceil(min_ms / groups / max(s.elapsed_time(e), 1e-3)))
    times = []
    for _ in range(groups):
        s.record()
        for _ in range(k):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / k)
    return statistics.median(times)


def wall_time(fn: Callable[[], Any], reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.dev = torch.device("cuda")
        self.model_dir = Path(args.model_dir)

    def save(self) -> None:
        Path(self.args.out).write_text(json.dumps(self.out, indent=1))

    def log(self, *a: Any) -> None:
        print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)

    # -- env ------------------------------------------------------------------------------
    def env(self) -> None:
        import tokenizers

        p = torch.cuda.get_device_properties(0)
        self.out["env"] = {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_mem_gib": p.total_memory / 2**30,
            "sm_count": p.multi_processor_count,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
        }
        self.log("env", self.out["env"])

    # -- correctness ----------------------------------------------------------------------
    def check(self) -> None:
        spec = EmbedSpec(name="e", version="1", max_batch_size=1024)
        gpu = EmbeddingModel(spec, EmbedRuntime(device="cuda", model_dir=str(self.model_dir)))
        cpu = EmbeddingModel(spec, EmbedRuntime(device="cpu", model_dir=str(self.model_dir)))
        texts = [
            *synthetic_texts(gpu.tokenizer, 48, 8, 256, seed=3),
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "Hi",
        ]
        a, b = torch.tensor(gpu.embed(texts)), torch.tensor(cpu.embed(texts))
        res: dict[str, Any] = {
            "fp16_cuda_vs_fp32_cpu_max_abs": float((a - b).abs().max()),
            "fp16_cuda_vs_fp32_cpu_min_cos": float((a * b).sum(-1).min()),
        }
        gpu.use_graphs = False
        c = torch.tensor(gpu.embed(texts))
        res["graphs_vs_eager_max_abs"] = float((a - c).abs().max())
        try:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(str(self.model_dir), device="cpu")
            st.max_seq_length = spec.max_tokens
            ref = torch.tensor(st.encode(texts, normalize_embeddings=True))
            res["fp32_cpu_vs_sentence_transformers_max_abs"] = float((b - ref).abs().max())
            res["sentence_transformers"] = __import__("sentence_transformers").__version__
        except Exception as exc:  # not installed, or no network for a missing file
            res["sentence_transformers_error"] = repr(exc)[:300]
        self.out["check"] = res
        self.log("check", res)
        gpu.close()

    # -- raw ceiling ----------------------------------------------------------------------
    def ceiling(self) -> None:
        res: dict[str, Any] = {"fp16": [], "hf_fp16": [], "bf16": []}
        self.out["ceiling"] = res
        with torch.inference_mode():
            enc = Encoder(self.model_dir, self.dev, torch.float16)
            gen = torch.Generator(device=self.dev).manual_seed(0)
            for s in SEQS:
                for b in BATCHES:
                    ids = torch.randint(
                        1000, 30000, (b, s), device=self.dev, dtype=torch.int32, generator=gen
                    )
                    lens = torch.full((b,), s, device=self.dev, dtype=torch.int32)
                    eager = cuda_time(functools.partial(enc, ids, lens))
                    g = torch.cuda.CUDAGraph()
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        enc(ids, lens)
                    torch.cuda.current_stream().wait_stream(side)
                    with torch.cuda.graph(g):
                        enc(ids, lens)
                    graph = cuda_time(g.replay)
                    del g
                    row = {
                        "batch": b,
                        "seq": s,
                        "eager_ms": eager,
                        "graph_ms": graph,
                        "items_s": b / min(eager, graph) * 1e3,
                    }
                    res["fp16"].append(row)
                self.log(
                    "ceiling seq", s, [round(r["items_s"]) for r in res["fp16"] if r["seq"] == s]
                )
                self.save()
            # Launch cost alone: the CPU time to enqueue one eager forward of a tiny batch.
            ids = torch.ones((1, 16), device=self.dev, dtype=torch.int32)
            lens = torch.full((1,), 16, device=self.dev, dtype=torch.int32)
            res["eager_enqueue_ms_b1_s16"] = wall_time(functools.partial(enc, ids, lens), reps=50)
            torch.cuda.synchronize()
            # The workload's mean length, uniform, no padding: the denominator for predict.
            mean_len = self.out.get("workload_mean_tokens", 68)
            res["at_mean_len"] = []
            for b in (64, 256, 512, 1024):
                s = round(mean_len)
                ids = torch.randint(1000, 30000, (b, s), device=self.dev, dtype=torch.int32)
                lens = torch.full((b,), s, device=self.dev, dtype=torch.int32)
                ms = cuda_time(functools.partial(enc, ids, lens))
                res["at_mean_len"].append({"batch": b, "seq": s, "ms": ms, "items_s": b / ms * 1e3})
            enc16 = Encoder(self.model_dir, self.dev, torch.bfloat16)
            for b in BATCHES:
                ids = torch.randint(1000, 30000, (b, 64), device=self.dev, dtype=torch.int32)
                lens = torch.full((b,), 64, device=self.dev, dtype=torch.int32)
                ms = cuda_time(functools.partial(enc16, ids, lens))
                res["bf16"].append({"batch": b, "seq": 64, "eager_ms": ms})
        self.save()
        try:
            from transformers import AutoModel

            hf = AutoModel.from_pretrained(str(self.model_dir)).half().to(self.dev).eval()
            with torch.inference_mode():
                for s in (64,):
                    for b in BATCHES:
                        ids = torch.randint(1000, 30000, (b, s), device=self.dev)
                        mask = torch.ones((b, s), device=self.dev, dtype=torch.int64)
                        ms = cuda_time(functools.partial(hf, input_ids=ids, attention_mask=mask))
                        res["hf_fp16"].append({"batch": b, "seq": s, "eager_ms": ms})
            import transformers

            res["transformers"] = transformers.__version__
        except Exception as exc:
            res["hf_error"] = repr(exc)[:300]
        torch.cuda.empty_cache()
        self.save()

    # -- CPU side -------------------------------------------------------------------------
    def cpu(self, texts: list[str]) -> None:
        tok = load_tokenizer(self.model_dir, 256)
        batch = texts[:1024]
        res: dict[str, Any] = {"n": len(batch)}
        one = wall_time(lambda: [tok.encode(t) for t in batch], reps=3)
        whole = wall_time(lambda: tok.encode_batch(batch), reps=5)
        chunked = wall_time(
            lambda: [tok.encode_batch(batch[i : i + 128]) for i in range(0, len(batch), 128)],
            reps=5,
        )
        if hasattr(tok, "encode_batch_fast"):
            res["tokenize_batch_fast_call_ms"] = wall_time(lambda: tok.encode_batch_fast(batch))
            res["tokenize_batch_fast_items_s"] = (
                len(batch) / res["tokenize_batch_fast_call_ms"] * 1e3
            )
        res["tokenize_single_calls_ms"] = one
        res["tokenize_batch_call_ms"] = whole
        res["tokenize_8_calls_of_128_ms"] = chunked
        res["tokenize_single_items_s"] = len(batch) / one * 1e3
        res["tokenize_batch_items_s"] = len(batch) / whole * 1e3
        encs = tok.encode_batch(batch)
        lens = [len(e.ids) for e in encs]
        res["real_tokens"] = sum(lens)
        seqs = [e.ids for e in encs]

        def pack() -> None:
            n = np.fromiter((len(x) for x in seqs), dtype=np.int32, count=len(seqs))
            s = int(n.max())
            arr = np.zeros((len(seqs), s), np.int32)
            arr[np.arange(s)[None, :] < n[:, None]] = np.fromiter(
                (t for x in seqs for t in x), dtype=np.int32, count=int(n.sum())
            )

        res["pack_ms"] = wall_time(pack)
        emb = torch.randn(len(batch), 384)
        res["tolist_ms"] = wall_time(emb.tolist)
        lists = emb.tolist()
        res["pickle_lists_ms"] = wall_time(lambda: pickle.dumps(lists, protocol=5))
        res["pickle_ndarray_ms"] = wall_time(lambda: pickle.dumps(emb.numpy(), protocol=5))
        # Host-to-device: ids of the whole batch, padded to 128 (int32).
        ids = torch.randint(0, 30000, (1024, 128), dtype=torch.int32)
        pinned = ids.pin_memory()

        def copy(src: torch.Tensor) -> None:
            src.to(self.dev, non_blocking=True)
            torch.cuda.synchronize()

        res["h2d_bytes"] = ids.numel() * 4
        res["h2d_pageable_ms"] = wall_time(lambda: copy(ids), reps=20)
        res["h2d_pinned_ms"] = wall_time(lambda: copy(pinned), reps=20)
        # While the GPU is busy: does enqueuing the copy block the CPU?
        big = torch.randn(8192, 8192, device=self.dev, dtype=torch.float16)
        for name, src in (("pageable", ids), ("pinned", pinned)):
            big @ big
            big @ big
            t0 = time.perf_counter()
            src.to(self.dev, non_blocking=True)
            res[f"h2d_{name}_enqueue_while_busy_ms"] = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
        res["busy_gemm_ms"] = cuda_time(
            functools.partial(torch.matmul, big, big), min_ms=10, groups=3
        )
        # Padding waste, one sub-batch (pad to the batch's longest) vs length buckets.
        arr = np.array(lens)
        waste = {}
        for n in (64, 256, 1024):
            sub = arr[:n]
            waste[f"none_b{n}"] = n * int(math.ceil(sub.max() / 8) * 8) / sub.sum() - 1
        res["padding_waste_unsorted"] = waste
        self.out["cpu"] = res
        self.log("cpu", res)
        self.save()

    # -- predict --------------------------------------------------------------------------
    def predict(self, texts: list[str]) -> None:
        spec = EmbedSpec(name="all-minilm-l6-v2", version="1", max_batch_size=1024)
        m = EmbeddingModel(spec, EmbedRuntime(device="cuda", model_dir=str(self.model_dir)))
        t0 = time.perf_counter()
        m.capture_graphs()
        capture_s = time.perf_counter() - t0
        profile = m.warmup()
        self.out["warmup"] = {
            "seconds": time.perf_counter() - t0,
            "profile_ms": profile,
            "peak_memory_mib": {n: b / 2**20 for n, b in m.peak_memory_bytes.items()},
            "graph_memory_mib": m.graph_memory_bytes / 2**20,
            "graphs": m.capture_graphs(),
            "capture_seconds": capture_s,
            "memory_allocated_mib": torch.cuda.memory_allocated() / 2**20,
        }
        self.log("warmup", self.out["warmup"])
        self.save()
        tok_ids = [e.ids for e in m.tokenizer.encode_batch(texts)]
        m.timing = True
        res: list[dict[str, Any]] = []
        self.out["predict"] = res

        def run(
            label: str,
            n: int,
            reps: int,
            ids: bool = False,
            switch_s: float = 0.0,
            array: bool = False,
            **attrs: Any,
        ) -> None:
            saved = {k: getattr(m, k) for k in attrs}
            saved_switch = sys.getswitchinterval()
            if switch_s:  # how much GIL hand-over latency costs the tokenizer thread
                sys.setswitchinterval(switch_s)
            for k, v in attrs.items():
                setattr(m, k, v)
            m.capture_graphs()  # shapes depend on bucket_tokens; keep captures out of timings
            try:
                rows = []
                for r in range(reps + 1):
                    off = (r * n) % max(1, len(texts) - n)
                    t0 = time.perf_counter()
                    if ids and array:
                        m.embed_ids_array(tok_ids[off : off + n])
                    elif ids:
                        m.embed_ids(tok_ids[off : off + n])
                    elif array:
                        m.embed_array(texts[off : off + n])
                    else:
                        m.predict(texts[off : off + n], {"normalize": True})
                    wall = (time.perf_counter() - t0) * 1e3
                    if r:  # the first is a warm-up
                        rows.append({**m.last_stats, "wall_ms": wall})
                med: dict[str, Any] = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
                med.update(
                    label=label,
                    batch=n,
                    items_s=n / med["wall_ms"] * 1e3,
                    busy=med.get("gpu_ms", 0) / med["wall_ms"],
                    overhead_ms=med["wall_ms"] - med.get("gpu_ms", 0),
                    padding_waste=med["padded_tokens"] / med["real_tokens"] - 1,
                )
                res.append(med)
                self.log(
                    f"predict {label:>22} b={n:5d} {med['items_s']:9.0f} items/s "
                    f"wall {med['wall_ms']:7.2f} gpu {med.get('gpu_ms', 0):7.2f} "
                    f"prep {med['prep_ms']:6.2f} tolist {med['tolist_ms']:6.2f} "
                    f"waste {med['padding_waste']:.2f} chunks {med['chunks']:.0f}"
                )
            finally:
                sys.setswitchinterval(saved_switch)
                for k, v in saved.items():
                    setattr(m, k, v)
            self.save()

        for n in (1, 8, 32, 64, 128, 256, 512, 1024):
            run("default", n, 20 if n <= 256 else 10)
        for n in (1, 8, 64, 1024):
            run("no_graphs", n, 20 if n < 1024 else 8, use_graphs=False)
        for bt in (8192, 16384):
            run(f"bucket_{bt}", 1024, 8, bucket_tokens=bt)
        run("one_tokenizer_unit", 1024, 8, first_unit_items=1024, unit_items=1024)
        run("units_128_then_512", 1024, 8, first_unit_items=128, unit_items=512)
        run("no_pipeline", 1024, 8, pipeline=False)
        run("pageable", 1024, 8, pin=False)
        run("slow_tokenizer_call", 1024, 8, encode_texts=m.tokenizer.encode_batch)
        for n in (64, 256, 1024):
            run("pretokenized", n, 10, ids=True)
        run("pretokenized_no_graphs", 1024, 8, ids=True, use_graphs=False)
        for n in (64, 256, 1024):
            run("text_array_out", n, 10, array=True)
            run("pretokenized_array_out", n, 10, ids=True, array=True)
        run("pretokenized_array_out_no_graphs", 1024, 8, ids=True, array=True, use_graphs=False)
        m.timing = False
        for n in (256, 1024):
            run("default_no_timing", n, 10)
            run("pretokenized_no_timing", n, 10, ids=True)
            run("pretokenized_array_out_no_timing", n, 10, ids=True, array=True)
        m.close()

    def main(self) -> None:
        self.env()
        tok = load_tokenizer(self.model_dir, 256)
        texts = synthetic_texts(tok, 4096, 8, 128, seed=7)
        lens = [len(e.ids) for e in tok.encode_batch(texts)]
        self.out["workload"] = "synthetic vocabulary-word texts, 8..128 tokens uniform, seed 7"
        self.out["workload_mean_tokens"] = statistics.mean(lens)
        self.save()
        for name in self.args.sections.split(","):
            t0 = time.perf_counter()
            if name == "check":
                self.check()
            elif name == "ceiling":
                self.ceiling()
            elif name == "cpu":
                self.cpu(texts)
            elif name == "predict":
                self.predict(texts)
            self.out.setdefault("section_seconds", {})[name] = time.perf_counter() - t0
            self.save()
        self.summary()

    def summary(self) -> None:
        o = self.out
        print(f"\nGPU {o['env']['gpu']}  torch {o['env']['torch']}  cpus {o['env']['cpu_count']}")
        c = o.get("ceiling", {})
        if c.get("fp16"):
            best = max(c["fp16"], key=lambda r: r["items_s"])
            print(
                f"ceiling best: {best['items_s']:.0f} items/s at b={best['batch']} s={best['seq']}"
            )
            for r in c.get("at_mean_len", []):
                print(
                    f"  at mean len {r['seq']}: b={r['batch']} {r['items_s']:.0f} items/s "
                    f"{r['ms']:.3f} ms"
                )
        for r in o.get("predict", []):
            print(
                f"  {r['label']:>22} b={r['batch']:5d} {r['items_s']:9.0f} items/s "
                f"overhead {r['overhead_ms']:.2f} ms busy {r['busy']:.2f}"
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=Settings().embed_model_dir)
    ap.add_argument("--out", default="gpu_bench.json")
    ap.add_argument("--sections", default="check,cpu,ceiling,predict")
    ns = ap.parse_args()
    if not ns.model_dir:
        from core.models.text_tokenizer import model_files_dir

        ns.model_dir = str(model_files_dir())
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    Bench(ns).main()
