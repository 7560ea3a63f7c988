"""The worker's GPU, read through NVML, for its scheduler's metrics.

A worker has no metrics endpoint of its own (scheduler/runtime/metrics.py says why): each
result it sends carries a reading of its GPU, taken at most once a second, which
the scheduler exports. NVML (the ``nvidia-ml-py`` package, module ``pynvml``) is
optional: without it, or without a GPU, results carry no reading.

Which GPU: the first one the worker's CUDA_VISIBLE_DEVICES names (an index or a
``GPU-...`` UUID); without one, NVML's first device, which is the one CUDA's
device 0 is when the container was given one GPU (the usual case in Kubernetes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

# NVML's utilization is averaged over its own sample period (1/6 s to 1 s by GPU);
# reading it more often than this per result costs time for nothing new.
SAMPLE_EVERY_S = 1.0


class DeviceSampler:
    def __init__(self, visible_devices: str):
        self._handle: Any = None
        self._name = ""
        self._nvml: Any = None
        self._last: dict[str, float | str] | None = None
        self._at = -SAMPLE_EVERY_S
        try:
            import pynvml  # nvidia-ml-py: optional
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return
            first = visible_devices.split(",")[0].strip()
            if first.startswith("GPU-"):
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(first)
            else:
                index = int(first) if first.isdigit() else 0
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._name = first if first and first != "cpu" else "0"
            self._nvml = pynvml
        except Exception as exc:  # no driver, no device: this worker has no GPU to report
            log.info("no GPU readings (%s)", exc)
            self._handle = None

    @property
    def present(self) -> bool:
        return self._handle is not None

    def sample(self, now: float | None = None) -> dict[str, float | str] | None:
        """The GPU's utilization (0..1) and memory (bytes), at most once a second."""
        if self._handle is None:
            return None
        now = time.monotonic() if now is None else now
        if now - self._at < SAMPLE_EVERY_S:
            return self._last
        self._at = now
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as exc:  # a transient NVML error: no reading this time
            log.debug("NVML read failed: %s", exc)
            return self._last
        self._last = {
            "gpu": self._name,
            "utilization": util.gpu / 100.0,
            "memory_used_bytes": float(mem.used),
            "memory_total_bytes": float(mem.total),
        }
        return self._last
