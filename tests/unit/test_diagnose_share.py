"""A finished request as replicas tell each other (pure): its durations survive the wire whatever
the clocks, every bound holds, and every malformed field is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.diagnose.share import MAX_BLOCKS, MAX_GAPS, MAX_SPAN_S, from_wire, to_wire
from proxy.diagnose.window import RequestRecord
from proxy.errors import BadRequest
from proxy.peers import MAX_FINISHED_PER_MESSAGE, decode, encode
from proxy.timing import RequestTiming

spans = st.floats(0.0, 100.0, allow_nan=False)


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    received = draw(st.floats(-1e6, 1e6))
    marks = sorted(draw(st.lists(spans, min_size=7, max_size=7)))
    present = draw(st.lists(st.booleans(), min_size=6, max_size=6))
    names = ("admitted", "dispatched", "upstream_headers", "first_byte", "first_token", "last_token")
    at = {n: received + m if keep else None for n, m, keep in zip(names, marks, present, strict=False)}
    maybe_time = st.none() | spans
    maybe_count = st.none() | st.integers(0, 10**6)
    timing = RequestTiming(received=received, **at, done=received + marks[6], prefix_hold=draw(spans),
                           token_gaps=draw(st.lists(spans, max_size=30)), worker_queue_time=draw(maybe_time),
                           worker_first_token_latency=draw(maybe_time), worker_e2e_latency=draw(maybe_time),
                           prompt_tokens=draw(maybe_count), cached_tokens=draw(maybe_count),
                           completion_tokens=draw(maybe_count))
    return RequestRecord(
        timing=timing, worker=draw(st.text(min_size=1, max_size=30)), outcome=draw(st.sampled_from(["ok", "error"])),
        prompt_tokens=timing.prompt_tokens, cached_tokens=timing.cached_tokens,
        completion_tokens=timing.completion_tokens,
        block_hashes=tuple(draw(st.lists(st.integers(0, 2**64 - 1), max_size=20))),
        block_tokens=draw(st.integers(1, 64)), estimated_prompt_tokens=draw(st.integers(0, 10**5)),
        policy=draw(st.sampled_from(["", "ttft", "round_robin"])), text_prompt=draw(st.booleans()),
        predicted_cached_tokens=draw(maybe_count), cause=draw(st.none() | st.just("upstream_timeout")),
        dp_rank=draw(st.none() | st.integers(0, 1023)))


def durations(t: RequestTiming) -> tuple[object, ...]:
    return (t.admission_wait, t.upstream_ttfb, t.ttft, t.upstream_ttft, t.decode, t.prefix_hold,
            t.worker_queue_time, t.worker_first_token_latency, t.worker_e2e_latency)


def close(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return all((x is None and y is None) or (isinstance(x, float) and isinstance(y, float) and abs(x - y) < 1e-5)
               for x, y in zip(a, b, strict=True))


@given(records(), st.floats(0.0, 50.0), st.floats(-1e6, 1e6))
def test_a_record_keeps_its_durations_on_another_clock(r: RequestRecord, age: float, theirs: float) -> None:
    # Written `age` s after it arrived (sender's clock), read on a clock that says `theirs` then.
    sent_at = r.timing.received + age
    got = from_wire(json.loads(json.dumps(to_wire(r, sent_at))), theirs, peer="p1")
    assert abs(got.timing.received - (theirs - age)) < 1e-5
    assert close(durations(got.timing), durations(r.timing))
    assert got.timing.token_gaps == pytest.approx(r.timing.token_gaps, abs=1e-6)
    assert got.peer == "p1"
    assert (got.worker, got.outcome, got.cause, got.policy, got.block_hashes, got.block_tokens, got.text_prompt,
            got.dp_rank) == (r.worker, r.outcome, r.cause, r.policy, r.block_hashes, r.block_tokens, r.text_prompt,
                             r.dp_rank)
    assert (got.prompt_tokens, got.cached_tokens, got.completion_tokens, got.predicted_cached_tokens,
            got.estimated_prompt_tokens) == (r.prompt_tokens, r.cached_tokens, r.completion_tokens,
                                             r.predicted_cached_tokens, r.estimated_prompt_tokens)


def base(**timing: object) -> RequestRecord:
    t = RequestTiming(received=10.0, first_token=10.5, done=11.0, **timing)  # type: ignore[arg-type]
    return RequestRecord(timing=t, worker="http://w1")


def test_a_long_answer_sends_a_sample_of_its_gaps_with_the_worst_one() -> None:
    gaps = [0.01] * (3 * MAX_GAPS)
    gaps[1234] = 0.9  # the one stall, which no even sample would hit
    wire = to_wire(base(token_gaps=gaps), 11.0)
    assert len(wire["gaps"]) == MAX_GAPS and max(wire["gaps"]) == 0.9


def test_what_a_sender_cannot_vouch_for_is_bounded_before_it_travels() -> None:
    wire = to_wire(RequestRecord(timing=RequestTiming(received=0.0, done=1.0, worker_queue_time=-2.0),
                                 worker="http://w1", block_hashes=tuple(range(MAX_BLOCKS + 5))), 2 * MAX_SPAN_S)
    assert wire["age"] == MAX_SPAN_S and wire["engine"][0] == 0.0 and len(wire["blocks"]) == MAX_BLOCKS
    from_wire(wire, 0.0, peer="p")  # and it reads back


def good(**change: object) -> dict[str, object]:
    return {**to_wire(base(), 11.0), **change}


@pytest.mark.parametrize(("item", "field"), [
    (3, "finished[0]"),
    (good(worker=""), "finished[0].worker"),
    (good(worker=7), "finished[0].worker"),
    (good(worker="x" * 3000), "finished[0].worker"),
    (good(age=-1.0), "finished[0].age"),
    (good(age=float("inf")), "finished[0].age"),
    (good(age="1"), "finished[0].age"),
    (good(age=None), "finished[0].age"),
    (good(marks=[0.1] * 6), "finished[0].marks"),
    (good(marks="0.1"), "finished[0].marks"),
    (good(marks=[None] * 7), "finished[0].marks[6]"),
    (good(marks=[0.0, -0.1, None, None, None, None, 1.0]), "finished[0].marks[1]"),
    (good(marks=[0.0, None, None, None, None, None, MAX_SPAN_S + 1]), "finished[0].marks[6]"),
    (good(gaps=[0.1, True]), "finished[0].gaps[1]"),
    (good(gaps=[0.01] * (MAX_GAPS + 1)), "finished[0].gaps"),
    (good(engine=[0.1, 0.2]), "finished[0].engine"),
    (good(engine=[0.1, -0.2, None]), "finished[0].engine[1]"),
    (good(tokens=[1, 2, -3]), "finished[0].tokens[2]"),
    (good(tokens=[1, 2.5, 3]), "finished[0].tokens[1]"),
    (good(blocks=[2**64]), "finished[0].blocks"),
    (good(blocks=list(range(MAX_BLOCKS + 1))), "finished[0].blocks"),
    (good(block_tokens=-1), "finished[0].block_tokens"),
    (good(block_tokens=0), "finished[0].block_tokens"),
    (good(text="yes"), "finished[0].text"),
    (good(outcome=None), "finished[0].outcome"),
    (good(cause=5), "finished[0].cause"),
    (good(policy=["ttft"]), "finished[0].policy"),
    (good(predicted_cached=-1), "finished[0].predicted_cached"),
    (good(hold=-0.5), "finished[0].hold"),
    (good(dp_rank=-1), "finished[0].dp_rank"),
    (good(dp_rank=1024), "finished[0].dp_rank"),
    (good(dp_rank=True), "finished[0].dp_rank"),
])
def test_a_malformed_record_names_its_field(item: object, field: str) -> None:
    with pytest.raises(BadRequest) as e:
        from_wire(item, 100.0, peer="p")
    assert e.value.message.startswith(field + ":"), e.value.message


def test_records_ride_a_peer_message_and_a_message_carries_a_bounded_number() -> None:
    msg = decode(encode([], [], "me", None, [base(), base()], now=12.0), now=50.0)
    assert msg.finished is not None and len(msg.finished) == 2
    assert msg.finished[0].timing.received == pytest.approx(48.0) and msg.finished[0].peer == "me"
    assert decode(encode([], [], "me")).finished is None  # a peer that shares none says nothing
    too_many = json.dumps({"v": 1, "finished": [good()] * (MAX_FINISHED_PER_MESSAGE + 1)}).encode()
    with pytest.raises(BadRequest) as e:
        decode(too_many)
    assert e.value.message.startswith("finished:")
    with pytest.raises(BadRequest) as e:
        decode(json.dumps({"v": 1, "finished": [good(), good(age=-1)]}).encode())
    assert e.value.message.startswith("finished[1].age:")
