"""Who may use the public ports: optional API keys, and the guards both frontends put in front.

API keys (``ApiKeys``, ``load_api_keys``). Keys come from ``security.api_keys_file`` (one per line,
blank lines and ``#`` comments ignored) and the environment variable ``security.api_keys_env``
(comma-separated). No key found = no authentication; a key file that is named but unreadable or
empty is a config error (fail closed, never silently open). A caller presents a key as
``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (HTTP headers or gRPC metadata). The check
compares SHA-256 digests of the presented key and of every configured key with
``hmac.compare_digest`` and visits every key, so its time depends neither on where the first
differing byte is nor on which key matched. Keys live only in this object: not in the config tree,
not in ``repr``, not in any log line or error message.

Open without a key: ``GET /health`` and ``GET /ready`` (probes) and the gRPC health service.
Everything else on the public HTTP and gRPC ports needs a key when keys are configured. The admin
port (``/metrics``, ``/workers``, ``/diagnosis``) is a separate listener, loopback by default; its
routes do not exist on the public port.

Guards, in order: API key (401 / UNAUTHENTICATED), then the per-client rate limit
(``limits.RateLimiter``; 429 / RESOURCE_EXHAUSTED). On gRPC a request message that does not parse
is INVALID_ARGUMENT (grpc would otherwise answer INTERNAL). Refused generation requests are recorded
like any other refused request (``Pipeline.reject``), so accepted = succeeded + failed still holds.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from proxy.clock import Clock
from proxy.config import ConfigError, SecurityConfig
from proxy.errors import BadRequest, RadixgateError, Unauthorized
from proxy.limits import (
    Handler,
    RateLimited,
    RateLimiter,
    client_identity,
    rate_limit_middleware,
    retry_after_header,
)
from proxy.request import Dialect

OPEN_PATHS = frozenset({"/health", "/ready"})
GENERATION_PATHS: Mapping[str, Dialect] = {
    "/generate": Dialect.SGLANG, "/v1/completions": Dialect.COMPLETIONS, "/v1/chat/completions": Dialect.CHAT,
    "/v1/responses": Dialect.RESPONSES, "/v1/messages": Dialect.MESSAGES, "/v1/embeddings": Dialect.EMBEDDINGS,
    "/v1/rerank": Dialect.RERANK, "/v1/score": Dialect.SCORE, "/v1/classify": Dialect.CLASSIFY}
# Charged as requests too: a stored response's lookup may ask every worker
# (frontends/responses_api.py); a token count, like /tokenize, runs the worker's tokenizer.
CHARGED_PREFIXES = ("/v1/responses/", "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/v1/tokenize",
                    "/v1/detokenize")
GRPC_GENERATION_SERVICE = "/radixgate.v1.Generation/"
GRPC_OPEN_SERVICES = ("/grpc.health.v1.Health/",)
KEY_HINT = "send Authorization: Bearer <key> or x-api-key: <key>"

# (frontend, dialect, error, received) — Pipeline.reject.
Reject = Callable[[str, str, RadixgateError, float], None]


class ApiKeys:
    """The configured keys, as digests; ``accepts(presented)`` in constant time."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in dict.fromkeys(keys) if k)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._digests)} keys)"

    def replace(self, other: ApiKeys) -> None:
        """Take ``other``'s keys (a rotation): every guard holding this object checks them at once."""
        self._digests = other._digests

    def accepts(self, presented: str | None) -> bool:
        given = _digest(presented or "")
        found = False
        for digest in self._digests:  # no early exit: every key costs the same comparison
            found |= hmac.compare_digest(given, digest)
        return found and bool(presented)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def load_api_keys(cfg: SecurityConfig, environ: Mapping[str, str]) -> ApiKeys:
    """Keys from ``cfg.api_keys_file`` and ``environ[cfg.api_keys_env]``; ``ConfigError`` names the field."""
    keys: list[str] = []
    if cfg.api_keys_file:
        try:
            text = Path(cfg.api_keys_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"security.api_keys_file: cannot read {cfg.api_keys_file!r}: "
                              f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
        found = [line.strip() for line in text.splitlines()]
        found = [k for k in found if k and not k.startswith("#")]
        if not found:
            raise ConfigError(f"security.api_keys_file: no keys in {cfg.api_keys_file!r}")
        keys += found
    if cfg.api_keys_env:
        keys += [k.strip() for k in environ.get(cfg.api_keys_env, "").split(",") if k.strip()]
    return ApiKeys(keys)


def load_admin_key(cfg: SecurityConfig, environ: Mapping[str, str]) -> ApiKeys:
    """The admin port's key for changing workers, from ``environ[cfg.admin_key_env]`` (none = no key)."""
    return ApiKeys([environ.get(cfg.admin_key_env, "").strip()] if cfg.admin_key_env else [])


def upstream_authorization(client_authorization: str | None, /, *, upstream_key: str | None,
                           own_keys_checked: bool) -> str | None:
    """The Authorization header sent to a worker.

    A configured upstream key wins. Without one, the caller's header is passed through only when
    radixgate authenticates nobody itself: a key issued for radixgate is never handed to a worker.
    """
    if upstream_key:
        return f"Bearer {upstream_key}"
    return None if own_keys_checked else client_authorization


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a caller presented: ``Authorization: Bearer KEY``, else ``x-api-key: KEY``."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if x_api_key and x_api_key.strip():
        return x_api_key.strip()
    return None


# -- HTTP ------------------------------------------------------------------------------------------
def _http_key(request: web.Request) -> str | None:
    return presented_key(request.headers.get("Authorization"), request.headers.get("x-api-key"))


def http_authorized(keys: ApiKeys) -> Callable[[web.Request], bool] | None:
    """Whether a request on the public HTTP port presents an accepted key; None when no keys are
    checked. (For what runs before the middleware: aiohttp's ``Expect`` handler.)"""
    if not keys:
        return None
    return lambda request: keys.accepts(_http_key(request))


def guard_http_app(app: web.Application, *, keys: ApiKeys, limiter: RateLimiter | None, clock: Clock,
                   reject: Reject, frontend: str = "http") -> None:
    """Put the API-key check and the rate limit in front of ``app`` (before it starts); no-ops when off."""
    from proxy.frontends.http import error_response

    def refuse(request: web.Request, err: RadixgateError) -> web.StreamResponse:
        dialect = GENERATION_PATHS.get(request.path)
        if dialect is not None:
            reject(frontend, dialect.value, err, clock.now())
        resp = error_response(err, dialect)
        if isinstance(err, Unauthorized):
            resp.headers["WWW-Authenticate"] = 'Bearer realm="radixgate"'
        return resp

    if keys:
        @web.middleware
        async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path not in OPEN_PATHS and not keys.accepts(_http_key(request)):
                return refuse(request, Unauthorized(f"missing or invalid API key; {KEY_HINT}"))
            return await handler(request)

        app.middlewares.append(authenticate)
    if limiter is not None:
        # A key names the client only when keys are checked: else any caller could mint fresh buckets.
        app.middlewares.append(rate_limit_middleware(
            limiter, clock, paths=frozenset(GENERATION_PATHS), credential=_http_key if keys else _no_key,
            refuse=refuse, prefixes=CHARGED_PREFIXES))


def _no_key(request: web.Request) -> None:
    return None


# -- gRPC ------------------------------------------------------------------------------------------
class _Malformed:
    """Stands in for a request message that did not parse, so the call can answer INVALID_ARGUMENT."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _metadata_key(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    found: dict[str, str] = {}
    for name, value in metadata or ():
        if name in ("authorization", "x-api-key") and isinstance(value, str):
            found.setdefault(name, value)
    return presented_key(found.get("authorization"), found.get("x-api-key"))


def _peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5555`` / ``ipv6:[::1]:5555`` → the address without the port."""
    _, _, rest = peer.partition(":")
    return rest.rsplit(":", 1)[0] if rest else peer


class GrpcGuard(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """API key on every service but health; rate limit and message parsing on ``Generation``."""

    def __init__(self, *, keys: ApiKeys, limiter: RateLimiter | None, clock: Clock, reject: Reject,
                 frontend: str = "grpc") -> None:
        self._keys, self._limiter, self._clock, self._reject = keys, limiter, clock, reject
        self._frontend = frontend
        self._wrapped: dict[str, Any] = {}  # method → its guarded handler (built once)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(GRPC_OPEN_SERVICES):
            return handler
        generation = method.startswith(GRPC_GENERATION_SERVICE)
        if self._keys and not self._keys.accepts(_metadata_key(details.invocation_metadata)):
            err = Unauthorized(f"missing or invalid API key; {KEY_HINT}")
            if generation:
                self._reject(self._frontend, Dialect.SGLANG.value, err, self._clock.now())
            return _refusing(handler, err)
        if generation and not handler.request_streaming:
            guarded = self._wrapped.get(method)
            if guarded is None:
                guarded = self._wrapped[method] = self._guarded(handler)
            return guarded
        return handler

    def _guarded(self, handler: Any) -> Any:
        parse = handler.request_deserializer

        def lenient(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as e:  # any parse failure is the caller's malformed message
                return _Malformed(f"{type(e).__name__}: {e}"[:200])

        async def admit(request: Any, context: Any) -> None:
            err: RadixgateError | None = None
            if isinstance(request, _Malformed):
                err = BadRequest(f"malformed request message ({request.reason})")
            elif self._limiter is not None:
                key = _metadata_key(context.invocation_metadata()) if self._keys else None  # checked keys only
                wait = self._limiter.check(client_identity(key, _peer_host(context.peer())), self._clock.now())
                if wait > 0:
                    err = RateLimited(f"rate limit: at most {self._limiter.rate:g} requests/s per client; "
                                      f"retry in {wait:.2f} s", retry_after=wait)
            if err is not None:
                self._reject(self._frontend, Dialect.SGLANG.value, err, self._clock.now())
                await _abort(context, err)

        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                await admit(request, context)
                return await inner_uu(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, lenient, handler.response_serializer)
        inner_us = handler.unary_stream
        if inspect.isasyncgenfunction(inner_us):
            async def unary_stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                await admit(request, context)
                async for item in inner_us(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream_gen, lenient, handler.response_serializer)

        async def unary_stream(request: Any, context: Any) -> Any:
            await admit(request, context)
            return await inner_us(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, lenient, handler.response_serializer)


async def _abort(context: Any, err: RadixgateError) -> None:
    if err.retry_after:
        context.set_trailing_metadata((("retry-after", retry_after_header(err.retry_after)),))
    await context.abort(err.grpc_code, err.message)


def _refusing(handler: Any, err: RadixgateError) -> Any:
    """A handler of the same shape as ``handler`` that ends every call with ``err`` (request unread)."""

    async def refuse(request: Any, context: Any) -> None:
        await _abort(context, err)

    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[
        (handler.request_streaming, handler.response_streaming)]
    return make(refuse, None, handler.response_serializer)
