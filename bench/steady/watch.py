"""What a long run records beside its traffic: each a thread sampling once a period into a
list of plain dicts, started and stopped with the run (``Watchers``).

* ``Readyz``: each API's /readyz (ready, its checks, the loop lag and answer delay the
  instance sheds on).
* ``Checkpoints``: forces a PostgreSQL ``CHECKPOINT`` every period, optionally after a
  competing bulk write, and records how long each took (a real slow moment of the
  database: dirty buffers written and fsynced, then full-page images in the WAL).
* ``CommitProbe``: a one-row commit every 100 ms, timed (what a commit costs right now).
* ``Resources``: resident memory and CPU of every process of the system (API, scheduler,
  workers, Kafka, PostgreSQL), PostgreSQL's table and index sizes, and the consumer
  groups' lag per topic; ``Cpu``: the CPU alone, each second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

Sample = dict[str, Any]


class Sampler(threading.Thread):
    def __init__(self, period_s: float, name: str):
        super().__init__(name=name, daemon=True)
        self.period_s = period_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._halt = threading.Event()

    def sample(self, t: float) -> Sample | None:
        raise NotImplementedError

    def run(self) -> None:
        next_at = time.monotonic() + self.period_s
        while not self._halt.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.period_s
            try:
                s = self.sample(time.time())
            except Exception:  # a sampler never ends the run; the gap shows in the series
                self.errors += 1
                continue
            if s is not None:
                self.samples.append(s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


class Readyz(Sampler):
    def __init__(self, url: str, period_s: float = 1.0):
        super().__init__(period_s, "readyz")
        self.url = url

    def sample(self, t: float) -> Sample:
        try:
            r = httpx.get(f"{self.url}/readyz", timeout=self.period_s * 2)
            body = r.json()
        except httpx.HTTPError as exc:
            return {"t": t, "status": 0, "error": type(exc).__name__}
        return {
            "t": t,
            "status": r.status_code,
            "database": body.get("checks", {}).get("database"),
            "database_state": body.get("checks", {}).get("database_state"),
            "database_ms": body.get("checks", {}).get("database_ms"),
            "answer_delay_ms": body.get("answer_delay_ms"),
            "loop_lag_ms": body.get("loop_lag_ms"),
        }


class Checkpoints(Sampler):
    """``CHECKPOINT`` every ``period_s`` (the first after one period). With ``ballast_mb``
    a competing writer first writes that much into a database of its own (a bulk load,
    a vacuum: a noisy neighbour on the same disk), so the checkpoint has that much to
    write and fsync while the system commits beside it; the table is emptied after."""

    def __init__(self, dsn: str, period_s: float, ballast_mb: int = 0):
        super().__init__(period_s, "checkpoints")
        self.dsn = dsn
        self.ballast_mb = ballast_mb
        if ballast_mb:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS bench_ballast (id int, pad text)")

    def sample(self, t: float) -> Sample:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            t0 = time.monotonic()
            if self.ballast_mb:
                # ~1 KiB a row: below TOAST's threshold, so stored as written.
                conn.execute(
                    "INSERT INTO bench_ballast SELECT g, repeat(md5(g::text), 31)"
                    " FROM generate_series(1, %s) g",
                    (self.ballast_mb * 1024,),
                )
            t1 = time.monotonic()
            conn.execute("CHECKPOINT")
            t2 = time.monotonic()
            if self.ballast_mb:
                conn.execute("TRUNCATE bench_ballast")
            return {"t": t, "ballast_s": round(t1 - t0, 3), "seconds": round(t2 - t1, 3)}


class CommitProbe(Sampler):
    """The database's commit latency as a client sees it: a one-row insert committed
    (synchronous_commit as configured) every ``period_s``."""

    def __init__(self, dsn: str, period_s: float = 0.1):
        super().__init__(period_s, "commit-probe")
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def sample(self, t: float) -> Sample:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            self._conn.execute("CREATE TABLE IF NOT EXISTS bench_probe (t double precision)")
        t0 = time.monotonic()
        self._conn.execute("INSERT INTO bench_probe VALUES (%s)", (t,))
        return {"t": t, "ms": round((time.monotonic() - t0) * 1000, 2)}

    def stop(self) -> None:
        super().stop()
        if self._conn is not None:
            self._conn.close()


# Sizes and live rows of the tables (partitions summed into their parent). Live rows come
# from the statistics counters, which lag the inserts by seconds: cheap, and close
# enough for bytes per row over minutes.
_BACKENDS = """
SELECT pid, backend_type, application_name, left(regexp_replace(query, '\\s+', ' ', 'g'), 60)
FROM pg_stat_activity WHERE pid <> pg_backend_pid()
"""
_SIZES = """
SELECT coalesce(p.relname, c.relname) AS name,
       sum(pg_table_size(c.oid))::bigint AS table_bytes,
       sum(pg_indexes_size(c.oid))::bigint AS index_bytes,
       sum(coalesce(s.n_live_tup, 0))::bigint AS live_rows
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_class p ON p.oid = i.inhparent
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
GROUP BY 1
"""


class Resources(Sampler):
    """RSS and CPU of the processes ``roots()`` names (each with its children), the
    database's sizes and Kafka's lag (``lag()``: topic -> messages behind)."""

    def __init__(
        self,
        roots: Callable[[], dict[str, int]],
        dsn: str,
        lag: Callable[[], dict[str, int]] | None,
        period_s: float = 10.0,
        private: bool = True,
    ):
        """``private``: also each process's USS (reads /proc/PID/smaps: a few ms each)."""
        super().__init__(period_s, "resources")
        self.private = private
        self.roots = roots
        self.dsn = dsn
        self.lag = lag
        self._procs: dict[int, psutil.Process] = {}
        self._spawn: dict[int, bool] = {}  # pid -> a spawned child (read once)
        self._lock = threading.Lock()  # Cpu reads the same processes from its thread

    def _proc(self, pid: int) -> psutil.Process:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = psutil.Process(pid)
        return p

    def _spawned(self, p: psutil.Process) -> bool:
        """A child that multiprocessing spawned to run the parent's code (uvicorn's API
        processes), not a helper of its own (multiprocessing's resource tracker)."""
        known = self._spawn.get(p.pid)
        if known is None:
            known = self._spawn[p.pid] = any("spawn_main" in a for a in p.cmdline())
        return known

    def processes(self, private: bool | None = None) -> dict[str, dict[str, float]]:
        with self._lock:
            return self._processes(self.private if private is None else private)

    def _processes(self, private: bool) -> dict[str, dict[str, float]]:
        """Each process by "<root>" or "<root>/<pid>" (pids: labels stay the process's
        own while others come and go): resident memory, private memory (USS: without the
        shared pages - PostgreSQL's shared buffers count in every backend's RSS as it
        touches them) and CPU seconds."""
        out: dict[str, dict[str, float]] = {}
        for name, pid in self.roots().items():
            with contextlib.suppress(psutil.Error):
                root = self._proc(pid)
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        p = self._proc(p.pid)
                        cpu = p.cpu_times()
                        mem = p.memory_full_info() if private else p.memory_info()
                        entry = out[name if p.pid == pid else f"{name}/{p.pid}"] = {
                            "rss_mb": round(mem.rss / 2**20, 1),
                            "uss_mb": round(getattr(mem, "uss", 0) / 2**20, 1),
                            "cpu_s": round(cpu.user + cpu.system, 2),
                        }
                        if p.pid != pid and self._spawned(p):
                            entry["spawned"] = True
        return out

    def sample(self, t: float) -> Sample:
        s: Sample = {"t": t, "processes": self.processes()}
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            s["tables"] = {
                r[0]: {
                    "table_mb": round(r[1] / 2**20, 2),
                    "index_mb": round(r[2] / 2**20, 2),
                    "rows": r[3],
                }
                for r in conn.execute(_SIZES).fetchall()
            }
            # Who each backend is (its kind, its client's name, what it ran last): a
            # backend's memory is the queries it runs, so a growing one is named by them.
            s["pg_backends"] = {
                str(r[0]): {"type": r[1], "app": r[2], "query": r[3]}
                for r in conn.execute(_BACKENDS).fetchall()
            }
        if self.lag is not None:
            s["lag"] = self.lag()
        return s


class Cpu(Sampler):
    """CPU seconds of every process of the system, each ``period_s`` (a second: where a
    start-up burst goes shows only at that grain)."""

    def __init__(self, resources: Resources, period_s: float = 1.0):
        super().__init__(period_s, "cpu")
        self.resources = resources

    def sample(self, t: float) -> Sample:
        procs = self.resources.processes(private=False)
        return {"t": t, "cpu_s": {k: v["cpu_s"] for k, v in procs.items()}}


class PySpyDumps(threading.Thread):
    """``py-spy dump`` of every Python process of the system at the given seconds of the
    run (what each thread was doing, for a diagnosis), into ``folder``."""

    def __init__(self, roots: Callable[[], dict[str, int]], at_s: list[float], folder: Path):
        super().__init__(name="py-spy", daemon=True)
        self.roots, self.at_s, self.folder = roots, sorted(at_s), folder
        self.start_mono = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        # On PATH, beside this interpreter, or in the bin/ of a venv on sys.path (a
        # worktree's venv borrows the main one's packages).
        bins = [str(Path(sys.executable).parent)]
        bins += [str(Path(p).parents[2] / "bin") for p in sys.path if p.endswith("site-packages")]
        path = os.pathsep.join([os.environ.get("PATH", ""), *bins])
        spy = shutil.which("py-spy", path=path) or "py-spy"
        for at in self.at_s:
            if self._halt.wait(max(0.0, self.start_mono + at - time.monotonic())):
                return
            out = []
            for name, pid in self.roots().items():
                if name.startswith(("kafka", "postgres")):
                    continue
                with contextlib.suppress(psutil.Error):
                    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                        r = subprocess.run(
                            [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True
                        )
                        out.append(f"=== {name} pid {p.pid} ===\n{r.stdout}{r.stderr}")
            (self.folder / f"py-spy-{at:g}s.txt").write_text("\n".join(out))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


class Watchers:
    def __init__(self, *samplers: Sampler | PySpyDumps):
        self.samplers = list(samplers)

    def __enter__(self) -> Watchers:
        for s in self.samplers:
            s.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.samplers:
            s.stop()
