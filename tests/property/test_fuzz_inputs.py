"""Bad input against the real servers (Hypothesis): the proxy answers a client error with a clear
message, never a 5xx / server-side gRPC code, never a crash.

One proxy (HTTP + gRPC) in front of two simulated workers runs on its own event loop in a thread
for the whole module; Hypothesis drives plain blocking clients at it. Categories: malformed JSON,
wrong types, out-of-range numbers, invalid UTF-8 (all must be 4xx), unknown fields (4xx or a
normal answer); for gRPC, undecodable message bytes and invalid typed messages (INVALID_ARGUMENT,
or NOT_FOUND for a model nobody serves) and valid ones with unknown fields. The cases tried are
counted and printed at the end of the module (run with ``-s`` to see them).
"""

from __future__ import annotations

import http.client
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy.app import App
from proxy.config import load
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.fixtures.loop_thread import LoopThread

EXAMPLES = 150
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)
TRIED: Counter[str] = Counter()


class Stack(LoopThread):
    """Two simulated workers and a proxy on a private event loop in a background thread."""

    def __init__(self) -> None:
        super().__init__("fuzz-stack", call_timeout_s=60.0)
        self.app: App | None = None

    async def _start(self) -> None:
        fleet = await self._stack.enter_async_context(
            Fleet.in_process([SimConfig(time_scale=2000.0), SimConfig(time_scale=2000.0)]))
        self.app = App(load(env={}, overrides={
            "workers.static": fleet.urls, "server.port": 0, "server.admin_port": 0, "server.grpc_port": -1,
            "health.interval_s": 0.5, "scrape.interval_s": 0.5, "upstream.total_timeout_s": 20.0,
            "telemetry.log_requests": False}), registry=CollectorRegistry())
        await self.app.start()
        self._stack.push_async_callback(self.app.stop, 2.0)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as s:
        yield s
    print("\nfuzz cases tried: " + ", ".join(f"{k}={v}" for k, v in sorted(TRIED.items()))
          + f" (total {sum(TRIED.values())})")


# -- HTTP ------------------------------------------------------------------------------------------
ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")


def valid_body(endpoint: str, stream: bool = False) -> dict[str, Any]:
    if endpoint == "/generate":
        return {"text": "fuzz me gently", "stream": stream, "sampling_params": {"max_new_tokens": 2}}
    if endpoint == "/v1/completions":
        return {"model": "", "prompt": "fuzz me gently", "max_tokens": 2, "stream": stream}
    return {"model": "", "messages": [{"role": "user", "content": "fuzz me gently"}], "max_tokens": 2,
            "stream": stream}


def post(stack: Stack, path: str, raw: bytes) -> tuple[int, bytes]:
    assert stack.app is not None
    conn = http.client.HTTPConnection("127.0.0.1", stack.app.http_port, timeout=30)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def error_message(body: bytes) -> str:
    doc = json.loads(body)
    err = doc.get("error", doc)
    message = err.get("message") if isinstance(err, dict) else err
    assert isinstance(message, str) and message.strip(), body[:300]
    return message


def check_refused(category: str, stack: Stack, path: str, raw: bytes) -> None:
    TRIED[category] += 1
    status, body = post(stack, path, raw)
    assert 400 <= status < 500, (status, raw[:200], body[:300])
    error_message(body)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def not_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return True
    return False


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
def test_malformed_json_is_400(stack: Stack, endpoint: str, data: st.DataObject) -> None:
    whole = json.dumps(valid_body(endpoint)).encode()
    raw = data.draw(st.one_of(
        st.binary(max_size=200).filter(not_json),
        st.integers(0, len(whole) - 1).map(lambda n: whole[:n]),  # truncated
        st.text(max_size=60).map(lambda t: ("{" + t).encode()).filter(not_json),
        st.just(whole.replace(b":", b"=", 1)), st.just(b"{'text': 'single quotes'}"), st.just(b""),
    ))
    check_refused("http_malformed_json", stack, endpoint, raw)


WRONG_TYPES: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "/generate": {
        "text": st.integers() | st.floats(allow_nan=False) | st.booleans()
        | st.dictionaries(st.text(max_size=5), json_scalars, min_size=1, max_size=3)
        | st.lists(st.dictionaries(st.text(max_size=3), json_scalars, max_size=2), min_size=1, max_size=3),
        "input_ids": st.text(min_size=1, max_size=10) | st.lists(st.text(max_size=3), min_size=1, max_size=4)
        | st.lists(st.floats(allow_nan=False).filter(lambda f: f != int(f) if f == f and abs(f) < 1e300 else True),
                   min_size=1, max_size=4) | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1),
        "stream": st.integers() | st.text(max_size=5) | st.lists(st.booleans(), max_size=2) | st.none(),
        "sampling_params": st.integers() | st.text(max_size=5) | st.lists(json_scalars, max_size=3),
        "model": st.integers() | st.lists(st.text(max_size=3), max_size=2) | st.booleans(),
        "rid": st.integers() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2) | st.booleans(),
    },
    "/v1/completions": {
        "prompt": st.integers() | st.floats(allow_nan=False) | st.booleans()
        | st.dictionaries(st.text(max_size=5), json_scalars, min_size=1, max_size=3),
        "max_tokens": st.text(max_size=5) | st.lists(st.integers(), max_size=3)
        | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        "stream": st.integers() | st.text(max_size=5) | st.none(),
        "model": st.integers() | st.booleans() | st.lists(st.integers(), max_size=2),
    },
    "/v1/chat/completions": {
        "messages": st.text(max_size=10) | st.integers() | st.just([])
        | st.lists(st.text(max_size=5) | st.integers(), min_size=1, max_size=3)
        | st.lists(st.fixed_dictionaries({"role": st.integers() | st.none()}), min_size=1, max_size=2)
        | st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.integers() | st.booleans()
                                          | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1)}),
                   min_size=1, max_size=2),
        "max_tokens": st.text(max_size=5) | st.lists(st.integers(), max_size=3),
        "stream": st.integers() | st.text(max_size=5) | st.none(),
    },
}


@FUZZ
@given(data=st.data())
def test_wrong_types_are_400(stack: Stack, data: st.DataObject) -> None:
    endpoint = data.draw(st.sampled_from(ENDPOINTS))
    field = data.draw(st.sampled_from(sorted(WRONG_TYPES[endpoint])))
    body = valid_body(endpoint)
    body[field] = data.draw(WRONG_TYPES[endpoint][field])
    if endpoint == "/generate" and field == "input_ids":
        del body["text"]
    check_refused("http_wrong_types", stack, endpoint, json.dumps(body).encode())


bad_counts = (st.integers(max_value=-1) | st.integers(min_value=2**40) | st.floats(allow_nan=False).filter(
    lambda f: f != int(f) or abs(f) > 2**40 if f == f and abs(f) != float("inf") else True))


@FUZZ
@given(data=st.data())
def test_out_of_range_numbers_are_400(stack: Stack, data: st.DataObject) -> None:
    endpoint = data.draw(st.sampled_from(ENDPOINTS))
    body = valid_body(endpoint, stream=data.draw(st.booleans()))
    where = data.draw(st.sampled_from(["count", "token_id"] if endpoint != "/v1/chat/completions" else ["count"]))
    if where == "count":
        value = data.draw(bad_counts)
        if endpoint == "/generate":
            body["sampling_params"]["max_new_tokens"] = value
        else:
            body["max_tokens"] = value
    else:
        ids = data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5))
        ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.integers(max_value=-1)
                                                                 | st.integers(min_value=2**40)))
        body.pop("text", None)
        body["input_ids" if endpoint == "/generate" else "prompt"] = ids
    raw = json.dumps(body).encode()  # Infinity / -Infinity are spelled as Python's json writes them
    check_refused("http_out_of_range_numbers", stack, endpoint, raw)


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), junk=st.binary(min_size=1, max_size=8), at=st.integers(0, 8))
def test_invalid_utf8_is_400(stack: Stack, endpoint: str, junk: bytes, at: int) -> None:
    bad = junk + b"\xff" if at % 2 else b"\xc3" + junk[:1].replace(b"\x80", b"") + b"\xfe"
    try:
        bad.decode("utf-8")
        pytest.fail("the junk should not decode")
    except UnicodeDecodeError:
        pass
    raw = json.dumps(valid_body(endpoint)).encode().replace(b"fuzz", b"fu" + bad + b"zz", 1)
    check_refused("http_invalid_utf8", stack, endpoint, raw)


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), stream=st.booleans(), data=st.data())
def test_lone_surrogates_in_text_are_400_or_served_never_5xx(stack: Stack, endpoint: str, stream: bool,
                                                             data: st.DataObject) -> None:
    surrogate = data.draw(st.integers(0xD800, 0xDFFF))
    raw = json.dumps(valid_body(endpoint, stream)).encode().replace(b"gently", b"gen\\u%04xtly" % surrogate, 1)
    TRIED["http_lone_surrogates"] += 1
    status, body = post(stack, endpoint, raw)
    assert status == 200 or 400 <= status < 500, (status, raw, body[:300])
    if status != 200:
        error_message(body)


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), stream=st.booleans(),
       extra=st.dictionaries(st.text(min_size=1, max_size=12), json_values, min_size=1, max_size=4))
def test_unknown_fields_are_ignored_or_refused_never_5xx(stack: Stack, endpoint: str, stream: bool,
                                                         extra: dict[str, Any]) -> None:
    body = valid_body(endpoint, stream)
    known = set(body) | {"input_ids", "input_embeds", "prompt", "text", "messages", "n", "rid", "best_of",
                         "echo", "logprobs", "stop", "stream_options", "sampling_params"}
    body.update({k: v for k, v in extra.items() if k not in known})
    TRIED["http_unknown_fields"] += 1
    status, answer = post(stack, endpoint, json.dumps(body).encode())
    assert status == 200 or 400 <= status < 500, (status, body, answer[:300])
    if status != 200:
        error_message(answer)
    elif stream:
        assert answer.endswith(b"data: [DONE]\n\n") and b'"error"' not in answer, answer[-300:]
    else:
        assert json.loads(answer)


# -- gRPC ------------------------------------------------------------------------------------------
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@pytest.fixture(scope="module")
def channel(stack: Stack) -> Iterator[grpc.Channel]:
    assert stack.app is not None
    with grpc.insecure_channel(f"127.0.0.1:{stack.app.grpc_port}") as ch:
        yield ch


def call_unary(channel: grpc.Channel, raw: bytes) -> grpc.StatusCode:
    method = channel.unary_unary("/radixgate.v1.Generation/GenerateUnary",
                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        method(raw, timeout=30)
    except grpc.RpcError as e:
        code: grpc.StatusCode = e.code()  # type: ignore[attr-defined]
        assert (e.details() or "").strip()  # type: ignore[attr-defined]
        return code
    return grpc.StatusCode.OK


@FUZZ
@given(raw=st.binary(max_size=120))
def test_grpc_message_bytes_that_do_not_decode_are_invalid_argument(stack: Stack, channel: grpc.Channel,
                                                                    raw: bytes) -> None:
    TRIED["grpc_raw_bytes"] += 1
    code = call_unary(channel, raw)
    assert code in CLIENT_ERRORS | {grpc.StatusCode.OK}, (code, raw)
    try:
        pb.GenerateRequest.FromString(raw)
    except Exception:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, raw


sampling_values = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.integers(0, 2**32 - 1), "temperature": st.floats(width=32), "top_p": st.floats(width=32),
    "top_k": st.integers(-2**31, 2**31 - 1), "min_p": st.floats(width=32),
    "repetition_penalty": st.floats(width=32), "seed": st.integers(-2**63, 2**63 - 1),
    "stop_token_ids": st.lists(st.integers(-2**31, 2**31 - 1), max_size=3),
    "extra_json": st.text(max_size=30) | json_values.map(json.dumps),
})


@FUZZ
@given(prompt=st.sampled_from(["text", "input_ids", "chat"]), data=st.data())
def test_grpc_invalid_typed_messages_are_invalid_argument_never_internal(
        stack: Stack, channel: grpc.Channel, prompt: str, data: st.DataObject) -> None:
    msg = pb.GenerateRequest(model=data.draw(st.sampled_from(["", "", "no-such-model"])))
    if prompt == "text":
        msg.text = data.draw(st.text(max_size=40))
    elif prompt == "input_ids":
        msg.input_ids.ids.extend(data.draw(st.lists(st.integers(-2**31, 2**31 - 1), max_size=6)))
    else:
        msg.chat.SetInParent()
        for role, content in data.draw(st.lists(st.tuples(st.sampled_from(["", "user", "x"]), st.text(max_size=10)),
                                                max_size=3)):
            msg.chat.messages.add(role=role, content=content)
    fields = data.draw(sampling_values)
    if fields:
        for name, value in fields.items():
            if name == "stop_token_ids":
                msg.sampling.stop_token_ids.extend(value)
            else:
                setattr(msg.sampling, name, value)
    if msg.sampling.max_new_tokens > 64 and data.draw(st.booleans()):
        msg.sampling.max_new_tokens = 4  # keep valid generations short
    TRIED["grpc_typed_messages"] += 1
    code = call_unary(channel, msg.SerializeToString())
    assert code in CLIENT_ERRORS | {grpc.StatusCode.OK}, (code, msg)
