"""A retry of an Idempotency-Key in the acceptance pipeline (pipeline.py, step 7): its
stored rows answer it, and what is sent again goes where its first attempt went."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from core.messages import RequestMessage
from ingest.acceptance.idempotency import aim, first_version
from ingest.acceptance.ports import Claim
from ingest.acceptance.state import AppState
from results.requests import AnswerRow
from results.tenants import Tenant

if TYPE_CHECKING:
    from ingest.acceptance.pipeline import Order


async def aim_at_first(
    st: AppState, order: Order, claim: Claim, msgs: list[RequestMessage], pending: Sequence[int]
) -> None:
    """A retry sent again goes to the version its first attempt was routed to, pinned,
    whatever a canary, promote, rollback or pin decided meanwhile (decision 44)."""
    spec = await first_version(st.catalog, order.spec, claim)
    if spec is order.spec:
        return
    params = order.params if order.reparams is None else order.reparams(spec, order.wire)
    for i in pending:
        aim(msgs[i], spec, order.inputs[i])
        msgs[i].params = params


async def replay(
    st: AppState,
    tenant: Tenant,
    order: Order,
    claim: Claim,
    ids: list[str],
    futs: list[asyncio.Future[AnswerRow]],
) -> bool:
    """A retry: its stored rows answer it; whether to send the rest again."""
    done = {str(r["request_id"]): r for r in await st.waiter.fetch(ids)}
    for rid, f in zip(ids, futs, strict=True):
        if rid in done and not f.done():
            f.set_result(done[rid])
    if all(f.done() for f in futs):
        return False
    generation = order.generation is not None
    if generation and (await st.waiter.progress(ids[0], tenant.id)).generating:
        return False  # running: its stream goes on, whatever the first caller did
    # Still running: wait for the first attempt, unless its caller gave up, in which
    # case some may never have reached Kafka.
    return claim.first_deadline is not None and claim.first_deadline < datetime.now(UTC)
