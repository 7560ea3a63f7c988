"""Settings for a PostgreSQL the project starts on a host it shares with GPUs. Pure.

PostgreSQL's defaults are sized for a small machine: 128 MiB of buffers and a
checkpoint every 1 GiB of WAL. A job writes about 2.2 KB of WAL a result row (a
384-float vector, its input, the index entries): on an H100 host, 819,200 job rows took
3 checkpoints and the backends wrote 420,000 buffers out themselves. Sized by the usual
rules (a quarter of memory for buffers, capped; WAL room for minutes of a job's writing,
within the disk), the same write took none of either, from the host's own memory and
disk, so the settings hold on any host. Its rows a second did not change in those 30 s
runs (bench/store/commit_rate.py, docs/bench/store.md); what it removes is the
checkpoints' full-page images and stalls over longer runs. The GPU-host bench starts its
server with them on request (``--pg-conf host``); an operator's own PostgreSQL is
theirs to size.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
# A quarter of memory for shared buffers (PostgreSQL's own guidance), capped: the GPU
# host's memory is the workers' and Kafka's too, and the OS cache holds the rest.
BUFFERS_SHARE, BUFFERS_CAP = 0.25, 16 * GIB
# WAL between checkpoints: room for minutes of writing at a job's rate (tens of MB/s),
# at most a tenth of the disk PostgreSQL's data lives on.
WAL_CAP, WAL_DISK_SHARE = 16 * GIB, 0.1
CHECKPOINT_TIMEOUT = "15min"


def host_settings(memory_bytes: int, disk_free_bytes: int | None = None) -> dict[str, str | int]:
    """The server settings for a host of ``memory_bytes`` (and ``disk_free_bytes`` free
    where its data lives, if known)."""
    buffers = max(128 * MIB, min(int(memory_bytes * BUFFERS_SHARE), BUFFERS_CAP))
    wal = WAL_CAP if disk_free_bytes is None else int(disk_free_bytes * WAL_DISK_SHARE)
    wal = max(1 * GIB, min(wal, WAL_CAP))
    return {
        "shared_buffers": f"{buffers // MIB}MB",
        "effective_cache_size": f"{max(buffers, memory_bytes // 2) // MIB}MB",
        # The WAL's own buffer: a commit of a 4,096-row write is ~9 MiB of WAL; the
        # automatic size (1/32 of shared buffers) stops at 16 MiB.
        "wal_buffers": "64MB",
        "max_wal_size": f"{wal // MIB}MB",
        "min_wal_size": f"{min(wal, 2 * GIB) // MIB}MB",
        "checkpoint_timeout": CHECKPOINT_TIMEOUT,
        "checkpoint_completion_target": "0.9",
    }
