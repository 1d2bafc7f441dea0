"""The one request type both frontends produce and the pipeline consumes.

Frontends parse the caller's body once into a ``GenerateRequest``; the pipeline routes on it and
forwards ``body`` (the caller's own bytes, or bytes the frontend rendered for it) unchanged
except for an added ``rid`` when the caller gave none.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from proxy.tracecontext import TraceContext


class Dialect(StrEnum):
    """Which upstream endpoint and error/stream format a request speaks."""

    SGLANG = "sglang"  # POST /generate
    COMPLETIONS = "completions"  # POST /v1/completions
    CHAT = "chat"  # POST /v1/chat/completions
    RESPONSES = "responses"  # POST /v1/responses (OpenAI Responses API)
    MESSAGES = "messages"  # POST /v1/messages (Anthropic Messages API, as SGLang serves it)
    EMBEDDINGS = "embeddings"  # POST /v1/embeddings (OpenAI; a worker started with --is-embedding)
    RERANK = "rerank"  # POST /v1/rerank (SGLang's; a cross-encoder worker, --is-embedding)
    SCORE = "score"  # POST /v1/score (SGLang's: label-token probabilities of query + item prompts)
    CLASSIFY = "classify"  # POST /v1/classify (SGLang's and vLLM's: a sequence classifier, --is-embedding)

    @property
    def path(self) -> str:
        return {"sglang": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions",
                "responses": "/v1/responses", "messages": "/v1/messages", "embeddings": "/v1/embeddings",
                "rerank": "/v1/rerank", "score": "/v1/score", "classify": "/v1/classify"}[self.value]

    @property
    def streams(self) -> bool:
        """Whether a request may ask for a stream: an embedding, a ranking, a score or a class is
        answered whole."""
        return not self.prefill_only

    @property
    def prefill_only(self) -> bool:
        """An endpoint whose prompts are prefilled and nothing sampled: answered whole, no sampling
        parameters."""
        return self in (Dialect.EMBEDDINGS, Dialect.RERANK, Dialect.SCORE, Dialect.CLASSIFY)

    @property
    def rid_field(self) -> str:
        """The body field that names the request to the engine (its rid, what ``/abort_request``
        takes): SGLang's and vLLM's Responses servers take ``request_id`` and make it the
        response's id, which must start with ``resp_`` to be retrievable."""
        return "request_id" if self is Dialect.RESPONSES else "rid"

    @property
    def abortable(self) -> bool:
        """Whether ``/abort_request {rid}`` reaches such a request: SGLang's Anthropic, rerank and
        score endpoints take no rid (their request models have none); closing the connection
        aborts them there."""
        return self not in (Dialect.MESSAGES, Dialect.RERANK, Dialect.SCORE)

    def new_rid(self) -> str:
        return ("resp_" if self is Dialect.RESPONSES else "") + uuid.uuid4().hex

    @property
    def error_style(self) -> str:
        return "sglang" if self is Dialect.SGLANG else "anthropic" if self is Dialect.MESSAGES else "openai"


@dataclass(slots=True)
class GenerateRequest:
    dialect: Dialect
    # The parsed JSON body (a dict); sampling params etc. pass through untouched.
    payload: dict[str, Any]
    model: str = ""
    stream: bool = False
    # Exactly one prompt form is set.
    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    rid: str | None = None
    # The worker this request must go to, whatever the policy would pick: a Responses follow-up
    # (``previous_response_id``) is served only by the worker that stored the conversation.
    pinned: str | None = None
    session_key: str | None = None
    priority: int = 0
    # Frontend name for metric labels: "http" or "grpc".
    frontend: str = "http"
    # Seconds from now the caller will wait (gRPC deadline), if any.
    timeout_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # The caller's W3C trace context (proxy/tracecontext.py); radixgate's own span under it when tracing.
    trace: TraceContext | None = None
    # The caller's raw JSON body when the frontend has it (forwarded as received); empty = the
    # pipeline serialises ``payload``.
    body: bytes = b""
