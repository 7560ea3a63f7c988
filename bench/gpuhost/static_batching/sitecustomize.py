"""Static batching in a scheduler started with this folder first on ``PYTHONPATH`` and
``GMBENCH_LM_BATCHING=static`` (the whole-system benchmark's ``generation`` scenario,
bench/gpuhost/generation.py). The service has no setting for it: continuous batching is
the only policy it serves. This puts ``bench.generation.static.ServedStaticBatcher`` in
place of ``ContinuousBatcher`` in ``scheduler.runtime.generation.engine`` as that module
is loaded, and nothing else; every other process is untouched. Then the next
``sitecustomize`` on the path runs, as it would have without this one."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "scheduler.runtime.generation.engine"
HERE = Path(__file__).resolve().parent


class _Swap(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            from bench.generation.static import ServedStaticBatcher

            module.ContinuousBatcher = ServedStaticBatcher  # type: ignore[attr-defined]
            print(f"{TARGET}: static batching (GMBENCH_LM_BATCHING)", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """The ``sitecustomize`` this one shadows, if the interpreter has one."""
    rest = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("GMBENCH_LM_BATCHING") == "static":
    sys.meta_path.insert(0, _Swap())
_chain()
