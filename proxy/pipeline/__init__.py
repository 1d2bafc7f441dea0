"""The one path every request takes, whichever frontend received it.

    key → admit → route → forward → time → record

1. key: ``prefix_key.build_route_request`` (block size = the healthy workers' page size, min 16;
   a text prompt's tokens counted with the bytes per token learned from the ``prompt_tokens``
   that finished answers reported, ``routing/token_estimate.py``).
2. admit: an ``Admission`` lease — waits at the proxy until a worker slot is free.
3. route: ``policy.select`` over fresh snapshots of the healthy workers that have a free slot and
   serve the model. A ``hold`` decision (``Decision.after``) waits, at most ``routing.hold_max_s``
   and the decision's ``hold_s``, for the named prefill's first token (``Pipeline.prefilled``, ``holds.py``),
   then selects again.
4. forward: POST the caller's bytes (plus a ``rid`` when they gave none, and
   ``stream_options.include_usage`` on an OpenAI stream that did not ask for it: its usage chunk is
   counted, not relayed, so every stream mode feeds the token counters) to the worker. Until the
   first byte of the answer reaches the client, a connect error, a 5xx, a 503 (queue full /
   starting) or a first-byte timeout moves the request to another worker, at most
   ``upstream.max_retries`` times (a refused connection on the last one answers 503). A
   stream is handed to the frontend only once its first complete event arrived, so a failed
   attempt costs the client nothing but time. A non-stream answer arrives whole, so no silence
   tells a hung worker from a long generation: past each ``first_byte_timeout_s`` the worker's
   health probe decides (passing: keep waiting; failing: the first-byte timeout's path).
   Every answer is judged before a byte of it reaches the client (``workers/answers.py``: status,
   content type, JSON-ness; ``sse_frames.check_events`` for each relayed run); a bad one, a protocol error
   or a breach of an ``upstream.max_*_bytes`` cap is a 502, retried like a 5xx. A stream ends at its
   deadline by the clock (one timer), whatever the worker still sends.
5. time: ``RequestTiming`` marks received, admitted, dispatched, upstream_headers, first_byte, each
   token-bearing chunk, done.
6. record: metrics, one JSON log line, ``policy.on_complete``, and ``observers`` (diagnosis).
   (A streamed answer's first token already told the policy: ``policy.on_first_token``.)

Where each part lives (read in this order to follow one request):

* ``core.py`` — ``Pipeline``: builds the shared ``Parts``, opens one ``Exchange`` per request;
* ``exchange.py`` — ``Exchange``: the state machine NEW → ADMITTING → ROUTING ⇄ HOLDING →
  ATTEMPTING → ANSWERED | RELAYING → ENDED; it holds the admission lease as ``async with``;
* ``holds.py`` — requests held for a prefill in progress (step 3);
* ``attempt.py`` — one try on one worker, up to its first complete events (step 4; ``Retry``);
* ``events.py`` — complete SSE events out of the worker's bytes;
* ``relay.py`` — an opened stream to the client, to its end or its deadline;
* ``end.py`` — outcome, feedback to the policy and estimates, the ``CompletedRequest`` (step 6);
* ``parts.py`` — what exchanges share (collaborators, the in-flight set, shared health checks);
* ``transport.py`` — the seam to the HTTP client to workers (``workers/upstream.py`` in the
  product; a scripted one in the state machine's unit tests).

Every wait (admission queue, hold, first byte, stream deadline, health checks, drain) is on the
injected ``Clock`` (``proxy/clock.py``), so a manual clock drives them in tests.

Two ways to consume an ``Exchange`` (``async with pipeline.exchange(req) as ex``):
* ``ex.chunks()`` — complete SSE events as raw bytes, relayed as they come (HTTP frontend);
* ``ex.events()`` — typed ``TextDelta`` / ``ErrorEvent`` and a final ``Finished`` (gRPC frontend).
A non-stream answer is ``ex.status`` / ``ex.body``. If the worker dies mid-stream the stream ends
with an error event and ``[DONE]``. If the consumer leaves early (client disconnect), leaving the
``async with`` closes the upstream connection and sends ``/abort_request`` for the ``rid``.
"""

from proxy.pipeline.core import Pipeline
from proxy.pipeline.exchange import Exchange, Phase, not_served
from proxy.pipeline.holds import hold_limit
from proxy.pipeline.parts import RouteListener
from proxy.pipeline.transport import Answer, Transport
from proxy.records import CompletedRequest, Finished, body_with_rid
from proxy.sse_frames import error_event

# Callers import the pipeline's records from here too.
__all__ = ["Answer", "CompletedRequest", "Exchange", "Finished", "Phase", "Pipeline", "RouteListener", "Transport",
           "body_with_rid", "error_event", "hold_limit", "not_served"]
