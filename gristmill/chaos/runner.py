"""One chaos run: start a system, load it, inject faults round by round, audit.

Per round: inject one fault (kill, wait its downtime, start again), measure the
recovery, wait until every component serves again, then a calm spell. After the
last round the load stops, every accepted request gets time to land, and the
audit compares PostgreSQL with the clients' ledger.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from gristmill.chaos import faults as fault_mod
from gristmill.chaos import netns
from gristmill.chaos.audit import AuditResult, audit, fetch_job_ids, fetch_rows, unsettled
from gristmill.chaos.chart import recovery_chart
from gristmill.chaos.faults import Fault
from gristmill.chaos.ledger import Ledger
from gristmill.chaos.load import LoadGenerator
from gristmill.chaos.recovery import measure
from gristmill.chaos.rig import Rig, own_services, running_rig
from gristmill.chaos.table import fault_lines, render
from gristmill.chaos.witness import Witness, client_accepted, witness
from results.db import make_engine

log = logging.getLogger(__name__)


@dataclass
class ChaosConfig:
    rounds: int = 20
    rate: float = 40.0  # requests per second, open loop
    seed: int | None = None
    kinds: tuple[str, ...] = ()  # empty: every kind the rig supports
    workdir: Path = Path(".gristmill/chaos")
    warmup_s: float = 5.0
    calm_s: float = 3.0
    settle_timeout_s: float = 60.0
    drain_timeout_s: float = 120.0
    timeout_ms: int = 10_000
    jobs: bool | None = None  # None: if the API has POST /v1/jobs
    job_every_s: float = 5.0
    progress: bool = True
    hold: bool = False  # keep everything up after the audit until Ctrl-C
    # A scheduler and an API in network namespaces of their own, for the cut-* faults;
    # None: where the machine allows it (root, iproute2: gristmill/chaos/netns.py).
    partitions: bool | None = None


@dataclass
class ChaosReport:
    faults: list[Fault]
    audit: AuditResult
    table: str
    jobs: bool
    seed: int
    workdir: Path
    unsettled: int = 0
    not_recovered: list[str] = field(default_factory=list)
    witness: Witness | None = None  # the durability ledger's account (decision 54)

    @property
    def ok(self) -> bool:
        lost = self.witness is not None and self.witness.failed
        return self.audit.ok and self.unsettled == 0 and not self.not_recovered and not lost

    def text(self) -> str:
        lines = [
            self.table,
            "",
            fault_lines(self.faults),
            "",
            f"seed {self.seed}; job items {'included' if self.jobs else 'not sent'}; "
            f"ledger and logs in {self.workdir}",
        ]
        if self.unsettled:
            lines.append(f"{self.unsettled} accepted requests never got a row (counted as lost)")
        if self.not_recovered:
            lines.append(f"not recovered in time: {', '.join(self.not_recovered)}")
        if self.witness is not None:
            lines.append(self.witness.line())
        if self.audit.problems:
            lines += ["", "problems:", *(f"  {p}" for p in self.audit.problems)]
        lines.append("PASS: nothing lost, duplicated or wrong" if self.ok else "FAIL")
        return "\n".join(lines)


def run_chaos(cfg: ChaosConfig, *, on_round: Callable[[Fault], None] | None = None) -> ChaosReport:
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    workdir = cfg.workdir.resolve() / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True)
    handler = logging.FileHandler(workdir / "chaos.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    wanted = [k for k in cfg.kinds if k.startswith("cut-")]
    partitions = cfg.partitions
    if partitions is None:
        partitions = (not cfg.kinds or bool(wanted)) and netns.available()
    elif partitions and not netns.available():
        raise RuntimeError("partitions asked for, but this machine allows no network namespaces")
    if wanted and not partitions:
        raise RuntimeError(f"{', '.join(wanted)} need network namespaces, which this machine lacks")
    try:
        with (
            own_services(workdir / "services", n_brokers=3) as services,
            running_rig(services, workdir / "system", partitions=partitions) as rig,
        ):
            report = _run(cfg, rig, rng, seed, workdir, on_round)
            if cfg.hold:
                _hold(rig)
            return report
    finally:
        log.removeHandler(handler)
        handler.close()


def _run(
    cfg: ChaosConfig,
    rig: Rig,
    rng: random.Random,
    seed: int,
    workdir: Path,
    on_round: Callable[[Fault], None] | None,
) -> ChaosReport:
    started = time.time()
    tenant_ids = list(rig.system.tenant_ids.values())
    engine = make_engine(rig.system.settings.database_url, pool_size=2)
    jobs = rig.has_jobs_api() if cfg.jobs is None else cfg.jobs
    kinds = cfg.kinds or fault_mod.available_kinds(rig)
    ledger = Ledger()
    load = LoadGenerator(
        urls=rig.urls,
        keys=rig.system.keys,
        ledger=ledger,
        rate=cfg.rate,
        timeout_ms=cfg.timeout_ms,
        job_every_s=cfg.job_every_s if jobs else None,
        seed=seed,
    )
    done: list[Fault] = []
    not_recovered: list[str] = []
    load.start()
    try:
        time.sleep(cfg.warmup_s)
        for rnd, kind in enumerate(fault_mod.plan(cfg.rounds, kinds, rng), start=1):
            log.info("round %d: %s", rnd, kind)
            fault = fault_mod.inject(rig, kind, rnd, rng)
            done.append(fault)
            measure(fault, rig, engine, ledger, tenant_ids, cfg.settle_timeout_s)
            missing = rig.wait_ready(cfg.settle_timeout_s)
            if missing or fault.recovery_s is None:
                not_recovered.append(f"round {rnd} ({kind}): {missing or 'no traffic'}")
                _restart_missing(rig, missing)
            log.info("round %d done: %s", rnd, fault)
            if on_round is not None:
                on_round(fault)
            time.sleep(cfg.calm_s)
    finally:
        load.stop(drain_timeout_s=cfg.timeout_ms / 1000 + 5)
    left = _drain(engine, ledger, tenant_ids, cfg.drain_timeout_s)
    rows = fetch_rows(engine, tenant_ids)
    starts = [f.injected_at for f in done]

    def kind_of(t: float) -> str:
        i = bisect.bisect_right(starts, t)
        return "none" if i == 0 else done[i - 1].kind

    result = audit(
        ledger.outcomes,
        ledger.jobs,
        rows,
        kind_of,
        ignore_input=lambda x: x == "warm up",
        job_ids=fetch_job_ids(engine, tenant_ids),
    )
    ledger.write(workdir / "ledger.jsonl")
    told = client_accepted(ledger.outcomes, ledger.jobs)
    second = witness(rig.system.settings, tenant_ids, started - 60, told)
    log.info("%s", second.line())
    (workdir / "faults.json").write_text(json.dumps([asdict(f) for f in done], indent=1))
    recovery_chart([asdict(f) for f in done], workdir / "recovery.png")
    report = ChaosReport(
        faults=done,
        audit=result,
        table=render(done, result),
        jobs=jobs,
        seed=seed,
        workdir=workdir,
        unsettled=left,
        not_recovered=not_recovered,
        witness=second,
    )
    (workdir / "report.txt").write_text(report.text() + "\n")
    return report


def _drain(engine: Engine, ledger: Ledger, tenant_ids: list[str], timeout_s: float) -> int:
    """Wait until every accepted request and job item has its row; return how many never did."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = unsettled(ledger.outcomes, ledger.jobs, fetch_rows(engine, tenant_ids))
        except Exception as exc:
            log.warning("drain query failed: %s", exc)
            left = -1
        if left == 0 or time.monotonic() > deadline:
            return max(left, 0)
        time.sleep(1.0)


def _restart_missing(rig: Rig, missing: list[str]) -> None:
    """A component that stayed down is a finding (reported); start it so the run goes on."""
    for name in missing:
        try:
            if name in rig.schedulers and rig.system.procs.get(name) is None:
                rig.start_scheduler(name)
            elif name in rig.apis and rig.system.procs.get(name) is None:
                rig.start_api(name)
        except Exception as exc:
            log.error("could not restart %s: %s", name, exc)


def _hold(rig: Rig) -> None:
    print(f"holding the system up; DATABASE_URL={rig.services.database_url}; Ctrl-C ends it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
