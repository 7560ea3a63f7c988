"""A request in the OpenTelemetry GenAI semantic conventions, worked out in one place:
the attributes of its span (decision 55) and its ``gen_ai.server.*`` metrics (decision
59), which every front door records through the acceptance pipeline.

The metrics' labels come from the model registry (the model's name, the version that
served it), never from what the client typed, and an error is named by Gristmill's
error code (``GristmillError.code``, a fixed set) or ``_OTHER``: a bounded label set
whatever a tenant sends. A request refused before its model is resolved (a body that
does not parse, an unknown model) is not in them: its only model name is the client's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import GristmillError
from core.messages import RequestMessage
from core.models.embedding import EmbedSpec
from core.models.token_ids import is_tokenized
from core.vocab import RequestStatus
from ingest import metrics
from ingest.edge.tracing import PROVIDER, genai_attributes

if TYPE_CHECKING:
    from ingest.acceptance.pipeline import Order

# The conventions' fallback for an error with no better low-cardinality name.
OTHER_ERROR = "_OTHER"


def operation_of(order: Order) -> str:
    """``gen_ai.operation.name``: ``text_completion`` for a generation, ``embeddings``
    for an embedding model, Gristmill's own ``infer`` for any other."""
    if order.generation is not None:
        return "text_completion"
    return "embeddings" if isinstance(order.spec, EmbedSpec) else "infer"


def input_tokens_of(order: Order, msgs: Sequence[RequestMessage]) -> int | None:
    """The input tokens the API counted: a generation's prompt, the ids of inputs it
    tokenized itself (None unless it tokenized every one)."""
    if order.generation is not None:
        return order.generation.prompt_tokens
    counted = [len(m.input["ids"]) for m in msgs if is_tokenized(m.input)]
    return sum(counted) if counted and len(counted) == len(msgs) else None


def span_attributes(order: Order, msgs: Sequence[RequestMessage]) -> dict[str, Any]:
    """The request's GenAI attributes on its span (ingest/edge/tracing.py)."""
    g = order.generation
    temperature = order.params.get("temperature")
    return genai_attributes(
        operation=operation_of(order),
        requested=order.asked or order.spec.name,
        served=order.spec.ref,
        input_tokens=input_tokens_of(order, msgs),
        max_tokens=g.max_tokens if g is not None else None,
        temperature=temperature if isinstance(temperature, int | float) else None,
    )


def error_type(error: BaseException) -> str:
    """``error.type``: the error's code (``rate_limited``, ``deadline_exceeded``, ...)."""
    return error.code if isinstance(error, GristmillError) else OTHER_ERROR


def row_error(row: Mapping[str, Any]) -> str:
    """``error.type`` of a finished row, as its caller's answer names it ("" if it
    succeeded)."""
    status = row["status"]
    if status == RequestStatus.SUCCEEDED:
        return ""
    return "deadline_exceeded" if status == RequestStatus.EXPIRED else "model_error"


def token_usage(
    input_counted: int | None, rows: Sequence[Mapping[str, Any]]
) -> tuple[int | None, int | None]:
    """(input, output) tokens of a request that succeeded: a generation's from its row
    (what it was billed), else the input the API counted; None where unknown."""
    outputs = [o for r in rows if isinstance(o := r.get("output"), dict)]
    if rows and len(outputs) == len(rows) and all("completion_tokens" in o for o in outputs):
        return (
            sum(int(o["prompt_tokens"]) for o in outputs),
            sum(int(o["completion_tokens"]) for o in outputs),
        )
    return input_counted, None


@dataclass(slots=True)
class Meter:
    """One request's ``gen_ai.server.*`` observations: made when it is accepted; a
    sync answer is finished by the pipeline, a stream by its door at its end."""

    labels: tuple[str, str, str, str]  # operation, provider, model, response model
    received: float  # epoch s: when the API received the request
    input_tokens: int | None
    first_token_seen: bool = False
    done: bool = False

    @classmethod
    def of(cls, order: Order, msgs: Sequence[RequestMessage], received: float) -> Meter:
        spec = order.spec
        labels = (operation_of(order), PROVIDER, spec.name, spec.ref)
        return cls(labels, received, input_tokens_of(order, msgs))

    def first_token(self, now: float) -> None:
        """A stream sent its first token (once)."""
        if not self.first_token_seen:
            self.first_token_seen = True
            metrics.genai_first_token(self.labels, now - self.received)

    def finished(
        self, now: float, rows: Sequence[Mapping[str, Any]] = (), error: BaseException | None = None
    ) -> None:
        """The request's answer is complete (its last byte sent), or failed: once."""
        if self.done:
            return
        self.done = True
        why = (
            error_type(error)
            if error is not None
            else next((e for r in rows if (e := row_error(r))), "")
        )
        metrics.genai_duration(self.labels, why, now - self.received)
        if not why:
            got_in, got_out = token_usage(self.input_tokens, rows)
            metrics.genai_tokens(self.labels, got_in, got_out)
