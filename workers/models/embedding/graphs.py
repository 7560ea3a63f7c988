"""CUDA graphs of the encoder: one captured forward per (rows, padded length).

An eager forward costs ~1.2 ms of CPU for ~80 kernel launches; a replay costs one.
Shapes are captured up front (``capture``), so no request pays for a capture, and
each shape's replay time is measured (``measure``): the sub-batch planner's costs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from workers.models import subbatch
from workers.models.embedding.encoder import Encoder


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    lens: torch.Tensor
    out: torch.Tensor  # pooled rows
    normed: torch.Tensor  # the same rows L2-normalized (captured too: no extra launches)


class CudaGraphs:
    """Captured forwards of ``encoder`` by (rows, padded length), sharing one memory pool."""

    def __init__(self, encoder: Encoder, device: torch.device):
        self.encoder = encoder
        self.device = device
        self.captured: dict[tuple[int, int], _Graph] = {}
        self._pool: Any = torch.cuda.graph_pool_handle()
        self.memory_bytes = 0  # reserved by captured graphs
        # Replay time per captured shape (ms), measured at warmup; the sub-batch planner
        # minimizes it. Until measured the H200 fit stands in.
        self.ms: dict[tuple[int, int], float] = {}

    def get(self, b: int, s: int) -> _Graph:
        """The graph for ``b`` rows of padded length ``s``, captured on first use."""
        g = self.captured.get((b, s))
        if g is None:
            ids = torch.zeros((b, s), dtype=torch.int32, device=self.device)
            lens = torch.ones((b,), dtype=torch.int32, device=self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm cuBLAS/SDPA outside the capture
                self.encoder(ids, lens)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the tokenizer thread may allocate pinned memory meanwhile.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self.encoder(ids, lens)
                normed = F.normalize(out, dim=-1)
            g = self.captured[(b, s)] = _Graph(graph, ids, lens, out, normed)
        return g

    def capture(self, shapes: Iterable[tuple[int, int]]) -> int:
        """Capture every shape in ``shapes`` now. Returns how many are captured."""
        before = torch.cuda.memory_reserved(self.device)
        with torch.inference_mode():
            for b, s in shapes:
                self.get(b, s)
        self.memory_bytes += torch.cuda.memory_reserved(self.device) - before
        return len(self.captured)

    def measure(self) -> None:
        """Replay time of every captured shape (ms, CUDA events)."""
        for (b, s), g in self.captured.items():
            g.graph.replay()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(3):
                g.graph.replay()
            t1.record()
            t1.synchronize()
            self.ms[(b, s)] = t0.elapsed_time(t1) / 3

    def cost(self, rows: int, seq: int) -> float:
        """Measured replay ms of a shape, else the fitted estimate."""
        ms = self.ms.get((rows, seq))
        return subbatch.fit_ms(rows, seq) if ms is None else ms
