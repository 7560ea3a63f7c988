"""The KV-cache block pool, as the policy sees it: block ids only, no tensors.

The runner owns the memory (``num_blocks * block_size`` token slots per layer); the
policy decides which ids a sequence holds, so it alone knows what is free, and the
plan tells the runner where each token's keys and values go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfBlocks(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"{n} blocks asked, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def release(self, blocks: Iterable[int]) -> None:
        self._free.extend(blocks)
