"""Every worker answer is judged here, before any byte of it reaches a client (pure).

The pipeline asks two questions of each answer (``Exchange._attempt``):

* ``judge_head(status, content_type, headers, stream=...)`` — what is this answer? One of
  ``STREAM`` (200 + ``text/event-stream`` to a stream request: relay its events), ``BODY`` (200:
  a whole JSON answer), ``CLIENT_ERROR`` (4xx: the worker's verdict on the request, relayed with
  its status), ``BUSY`` (503: back-pressure, try another worker), ``FAILED`` (other 5xx: try
  another worker, count it against this one). Anything else raises ``BadAnswer``: a redirect
  (never followed — a worker must not steer the proxy elsewhere, and a 3xx relayed without its
  ``Location`` is useless), other 2xx (204, 206, ...: no answer to relay), a status outside
  100-599, a compressed answer the proxy never asked for (``Content-Encoding``).
* ``judge_body(body, content_type)`` — a ``BODY`` answer must be JSON (an object, or a list for
  a batch) declared as JSON or undeclared: a truncated body or a balancer's HTML page is a
  ``BadAnswer``, not a 200 to relay and not a 500 in the proxy.

A stream's events are judged by ``sse_frames.check_events``. ``BadAnswer`` and the transport's own
refusals (``http1.UpstreamProtocolError``: bad status line, head or framing, a body over
``upstream.max_response_bytes``) become a 502 ``UpstreamError`` — retried on another worker while
nothing has reached the client (``upstream.max_retries``), and counted against the worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from proxy import safejson


class Kind(Enum):
    STREAM = "stream"
    BODY = "body"
    CLIENT_ERROR = "client_error"
    BUSY = "busy"
    FAILED = "failed"


class BadAnswer(Exception):
    """A worker answer radixgate will not relay; ``cause`` is the bounded metric label."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause, self.message = cause, message


JSON_TYPES = ("application/json", "")


def _is_json_type(content_type: str) -> bool:
    return content_type in JSON_TYPES or content_type.endswith("+json")


def judge_head(status: int, content_type: str, headers: Mapping[str, str], *, stream: bool) -> Kind:
    """What the answer with this head is (see the module docstring); ``BadAnswer`` when it is none."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        raise BadAnswer("protocol_error", f"worker compressed its answer (Content-Encoding: {encoding[:30]}) "
                                          "though radixgate asked for none")
    if 500 <= status <= 599:
        return Kind.BUSY if status == 503 else Kind.FAILED
    if 400 <= status <= 499:
        return Kind.CLIENT_ERROR
    if status == 200:
        return Kind.STREAM if stream and content_type == "text/event-stream" else Kind.BODY
    if 300 <= status <= 399:
        where = headers.get("location", "")
        raise BadAnswer("protocol_error", f"worker answered a redirect (HTTP {status}"
                                          f"{' to ' + repr(where[:80]) if where else ''}); "
                                          "radixgate does not follow worker redirects")
    raise BadAnswer("protocol_error", f"worker answered HTTP {status}, not an answer radixgate can relay")


def client_error_body(status: int, body: bytes, content_type: str) -> bytes:
    """A 4xx answer's body for the client: the worker's own when it is a JSON object, else the
    worker's status and the start of its text in radixgate's error shape (a balancer's HTML 404
    becomes JSON the client can read)."""
    if _is_json_type(content_type):
        try:
            if isinstance(safejson.loads(body), dict):
                return body
        except ValueError:
            pass
    text = body[:200].decode("utf-8", "replace")
    return json.dumps({"error": {"message": f"worker answered HTTP {status}: {text}",
                                 "type": "invalid_request_error", "code": status}}).encode()


def judge_body(body: bytes, content_type: str) -> Any:
    """The parsed JSON of a 200 answer (an object or a list); ``BadAnswer`` for anything else."""
    if not _is_json_type(content_type):
        raise BadAnswer("bad_answer", f"worker answered 200 with Content-Type {content_type[:60]!r}, not JSON")
    try:
        doc = safejson.loads(body)
    except ValueError as e:
        raise BadAnswer("bad_answer", f"worker answered 200 with a body that is not JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict | list):
        raise BadAnswer("bad_answer", f"worker answered 200 with a JSON {type(doc).__name__}, not an object")
    return doc
