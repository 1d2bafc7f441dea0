"""KV event batches as SGLang and vLLM send them, decoded; one worker's exact block table."""

from __future__ import annotations

from array import array

import msgpack
import msgspec
import pytest

from proxy.routing.kv_index import EngineBlocks, chain_keys
from proxy.workers.kv_events import (
    Cleared,
    EventError,
    EventLimits,
    Removed,
    Stored,
    decode_batch,
    decode_seq,
)
from tests.fixtures import kv_event_layouts as layouts


def ids(*tokens: int) -> array[int]:
    return array("I", tokens)

# The bytes each engine publishes for the batches of tests/fixtures/kv_event_layouts.py (msgspec
# encodes its Structs so; the first test re-encodes them and compares).
SGLANG = bytes.fromhex(
    "93cb41da4b606c2000009496ab426c6f636b53746f726564920b0cc098010203040506070804c096ab426c6f636b5374"
    "6f726564910d0c94090a0b0c04c092ac426c6f636b52656d6f766564910d91b0416c6c426c6f636b73436c6561726564"
    "00"
)
VLLM_OLD = bytes.fromhex(
    "93cb41da4b606c5000009297ab426c6f636b53746f72656492fb07c098010203040506070804c0a347505593ac426c6f"
    "636b52656d6f7665649107a3475055c0"
)
VLLM = bytes.fromhex(
    "83a27473cb41da4b606c800000a66576656e74739488a474797065ab426c6f636b53746f726564ac626c6f636b5f6861"
    "7368657392c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fc42001020304050607"
    "08090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20b1706172656e745f626c6f636b5f68617368c0a9746f6b"
    "656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a9"
    "6c6f72615f6e616d65c088a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c42000000000"
    "00000000000000000000000000000000000000000000000000000000b1706172656e745f626c6f636b5f68617368c420"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20a9746f6b656e5f69647394090a0b0caa"
    "626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083a474797065"
    "ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c4200102030405060708090a0b0c0d0e0f10111213"
    "1415161718191a1b1c1d1e1f20a66d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564b2"
    "646174615f706172616c6c656c5f72616e6b01"
)


def test_the_fixtures_are_the_bytes_the_engines_structs_encode_to() -> None:
    assert layouts.sglang_batch() == SGLANG
    assert layouts.vllm_old_batch() == VLLM_OLD
    assert layouts.vllm_batch() == VLLM


def test_sglang_array_layout_decodes_every_event_type() -> None:
    batch = decode_batch(SGLANG)
    assert batch.ts == 1764590000.5 and batch.dp_rank == 0
    assert batch.events == (
        Stored((11, 12), None, ids(1, 2, 3, 4, 5, 6, 7, 8), 4),
        Stored((13,), 12, ids(9, 10, 11, 12), 4),
        Removed((13,)),
        Cleared(),
    )


def test_vllm_array_layout_with_medium_and_negative_hashes() -> None:
    batch = decode_batch(VLLM_OLD)
    assert batch.dp_rank is None
    assert batch.events == (Stored((-5, 7), None, ids(1, 2, 3, 4, 5, 6, 7, 8), 4, "GPU"), Removed((7,), "GPU"))


def test_vllm_map_layout_with_bytes_hashes_and_tiers() -> None:
    batch = decode_batch(VLLM)
    h1, h2 = bytes(range(32)), bytes(range(1, 33))
    assert batch.dp_rank == 1
    assert batch.events == (
        Stored((h1, h2), None, ids(1, 2, 3, 4, 5, 6, 7, 8), 4, "GPU"),
        Stored((bytes(32),), h2, ids(9, 10, 11, 12), 4, "CPU"),
        Removed((h2,), "GPU"),
        Cleared(),
    )


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", msgpack.packb("batch"), msgpack.packb([1.0]), msgpack.packb(["x", []]),
    msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2, 3], 4, None]]]) + b"trailing",
    msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2, 3, 4, 5], 4, None]]]),  # 5 tokens, 1 block of 4
    msgpack.packb([1.0, [["BlockStored", [], None, [], 4, None]]]),
    msgpack.packb([1.0, [["BlockStored", [1], None, [-1], 1, None]]]),
    msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0, None]]]),
    msgpack.packb([1.0, [["BlockStored", [True], None, [1], 1, None]]]),
    msgpack.packb([1.0, [["BlockEvicted", [1]]]]),
    msgpack.packb([1.0, [{"block_hashes": [1]}]]),
    msgpack.packb([1.0, [["BlockRemoved", [1], 5]]]),
    msgpack.packb({"ts": "now", "events": []}),
])
def test_anything_malformed_is_an_event_error_never_a_partial_batch(payload: bytes) -> None:
    with pytest.raises(EventError):
        decode_batch(payload)


def test_caps_bound_what_one_batch_may_carry() -> None:
    many = msgpack.packb([1.0, [["AllBlocksCleared"]] * 11])
    assert len(decode_batch(many, EventLimits(max_events=11)).events) == 11
    with pytest.raises(EventError, match="over the 10 cap"):
        decode_batch(many, EventLimits(max_events=10))
    with pytest.raises(EventError, match="byte cap"):
        decode_batch(SGLANG, EventLimits(max_payload_bytes=len(SGLANG) - 1))
    long = msgpack.packb([1.0, [["BlockStored", [1], None, list(range(64)), 64, None]]])
    with pytest.raises(EventError):
        decode_batch(long, EventLimits(max_tokens_per_event=63))


def test_sequence_numbers_are_8_byte_big_endian() -> None:
    assert decode_seq((5).to_bytes(8, "big")) == 5
    assert decode_seq((-1).to_bytes(8, "big", signed=True), signed=True) == -1
    with pytest.raises(EventError):
        decode_seq(b"\x00" * 4)


def _blocks(*payloads: bytes) -> EngineBlocks:
    table = EngineBlocks()
    for payload in payloads:
        for event in decode_batch(payload).events:
            table.apply(event)
    return table


def test_the_table_matches_a_request_by_its_token_ids_as_the_engine_would() -> None:
    table = EngineBlocks()
    for event in decode_batch(SGLANG).events[:2]:
        table.apply(event)
    assert len(table) == 3 and table.block_size == 4
    assert table.matched_tokens([*list(range(1, 13)), 99, 98]) == 12
    assert table.matched_tokens([1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12]) == 4  # stops at the first miss
    assert table.matched_tokens([2, 1, 3, 4]) == 0
    assert table.matched_tokens([1, 2, 3]) == 0  # no full block
    table.apply(decode_batch(SGLANG).events[2])  # BlockRemoved of the third block
    assert table.matched_tokens(list(range(1, 13))) == 8
    table.apply(Cleared())
    assert table.matched_tokens(list(range(1, 13))) == 0 and len(table) == 0


def test_lower_tiers_do_not_count_and_bytes_hashes_work() -> None:
    table = _blocks(VLLM)  # ends with AllBlocksCleared
    assert len(table) == 0
    table = EngineBlocks()
    for event in decode_batch(VLLM).events[:2]:  # GPU blocks 1-2, then a CPU-tier block after h2
        table.apply(event)
    assert len(table) == 2 and table.matched_tokens(list(range(1, 13))) == 8
    table.apply(decode_batch(VLLM).events[2])  # h2 removed from the GPU
    assert table.matched_tokens(list(range(1, 13))) == 4


def test_blocks_under_an_adapter_a_salt_or_media_are_scoped() -> None:
    sgl = layouts.SglBlockStored([1], None, [5, 6, 7, 8], 4, 3)  # lora_id 3
    vllm_salted = layouts.VllmBlockStored([b"\x01" * 32], None, [5, 6, 7, 8], 4, None, "GPU", None, [("salt-a",)])
    vllm_lora = layouts.VllmBlockStored([b"\x02" * 32], None, [5, 6, 7, 8], 4, 7, "GPU", "adapter-x")
    plain = layouts.VllmBlockStored([b"\x03" * 32], None, [5, 6, 7, 8], 4, None, "GPU", None, [None])

    def stored(event: object, batch: type) -> Stored:
        (decoded,) = decode_batch(msgspec.msgpack.encode(batch(1.0, [event]))).events
        assert isinstance(decoded, Stored)
        return decoded
    assert stored(sgl, layouts.SglBatch).scoped
    assert stored(vllm_salted, layouts.VllmBatch).scoped and stored(vllm_lora, layouts.VllmBatch).scoped
    assert not stored(plain, layouts.VllmBatch).scoped
    assert not any(e.scoped for e in decode_batch(SGLANG).events if isinstance(e, Stored))


def test_scoped_blocks_match_no_prompt_by_its_tokens_and_can_still_be_removed() -> None:
    """The same tokens cached under a LoRA adapter (or a salt) are no hit for a plain request."""
    table = EngineBlocks()
    table.apply(Stored((1,), None, ids(5, 6, 7, 8), 4))
    table.apply(Stored((2,), 1, ids(9, 10, 11, 12), 4, scoped=True))  # under an adapter, after a plain block
    table.apply(Stored((3,), 2, ids(13, 14, 15, 16), 4))  # its child: unreachable too
    table.apply(Stored((4,), None, ids(20, 21, 22, 23), 4, scoped=True))
    assert len(table) == 4
    assert table.matched_tokens(list(range(5, 17))) == 4  # the plain head only
    assert table.matched_tokens([20, 21, 22, 23]) == 0
    table.apply(Removed((2, 3, 4)))
    assert len(table) == 1 and table.matched_tokens([5, 6, 7, 8]) == 4


def test_a_block_whose_parent_was_never_seen_is_left_out() -> None:
    table = EngineBlocks()
    table.apply(Stored((13,), 12, ids(9, 10, 11, 12), 4))
    assert len(table) == 0 and table.orphans == 1


def test_a_duplicate_store_counts_once_and_one_remove_undoes_it() -> None:
    table = EngineBlocks()
    first = Stored((1,), None, (5, 6), 2)
    table.apply(first)
    table.apply(first)
    assert len(table) == 1
    table.apply(Removed((1,)))
    assert table.matched_tokens([5, 6]) == 0


def test_the_same_tokens_under_two_engine_hashes_stay_held_until_both_go() -> None:
    table = EngineBlocks()
    table.apply(Stored((1,), None, (5, 6), 2))
    table.apply(Stored((2,), None, (5, 6), 2))  # e.g. two LoRA adapters
    table.apply(Removed((1,)))
    assert table.matched_tokens([5, 6]) == 2
    table.apply(Removed((2,)))
    assert table.matched_tokens([5, 6]) == 0


def test_the_table_is_bounded_and_a_new_page_size_starts_over() -> None:
    table = EngineBlocks(max_blocks=2)
    table.apply(Stored((1, 2, 3), None, tuple(range(6)), 2))
    assert len(table) == 2 and table.refused == 1
    table.apply(Stored((9,), None, (1, 2, 3, 4), 4))
    assert len(table) == 1 and table.block_size == 4 and table.clears == 1


def test_request_keys_chain_like_the_stored_blocks() -> None:
    keys = chain_keys(list(range(1, 13)), 4)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert chain_keys(list(range(1, 9)), 4) == keys[:2]
    assert chain_keys(list(range(1, 13)), 4, max_blocks=1) == keys[:1]
    assert chain_keys([9, 10, 11, 12], 4) != keys[2:]  # a block's key names its whole prefix


def test_a_match_says_whether_the_next_block_was_removed_or_never_reported() -> None:
    table = EngineBlocks()
    table.apply(Stored((1, 2), None, (1, 2, 3, 4, 5, 6, 7, 8), 4))
    assert table.match(list(range(1, 13))) == (8, False)  # block 3 never reported: maybe being stored
    table.apply(Removed((2,)))
    assert table.match(list(range(1, 13))) == (4, True)  # block 2 reported gone
    table.apply(Stored((2,), 1, (5, 6, 7, 8), 4))
    assert table.match(list(range(1, 9))) == (8, False)
    table.apply(Cleared())
    assert table.match(list(range(1, 9))) == (0, True)  # after a clear, whatever is absent is gone


def test_auto_endpoints_come_from_the_workers_own_config_with_star_read_as_its_host() -> None:
    from proxy.clock import MonotonicClock
    from proxy.config import KvEventsConfig
    from proxy.workers.kv_fleet import KvFleet

    configs = {"http://10.0.0.7:30000": '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}',
               "http://[fd00::2]:30000": '{"endpoint": "tcp://*:5557"}',
               "http://10.0.0.9:30000": '{"publisher": "null"}',
               "http://10.0.0.10:30000": "not json"}
    fleet = KvFleet(KvEventsConfig(endpoint="auto"), MonotonicClock(), reported=configs.get)
    assert fleet.endpoints("http://10.0.0.7:30000") == ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")
    assert fleet.endpoints("http://[fd00::2]:30000") == ("tcp://[fd00::2]:5557", None)
    assert fleet.endpoints("http://10.0.0.9:30000") is None
    assert fleet.endpoints("http://10.0.0.10:30000") is None
    assert fleet.endpoints("http://10.0.0.11:30000") is None  # nothing reported yet


def test_one_prompt_matched_against_tables_of_different_page_sizes_gets_each_its_own_keys() -> None:
    # Keys are remembered for the last prompt; a table of another page size must not reuse them.
    small, big = EngineBlocks(), EngineBlocks()
    small.apply(Stored((1, 2), None, tuple(range(8)), 4))
    big.apply(Stored((9,), None, tuple(range(8)), 8))
    prompt = list(range(12))
    for _ in range(2):
        assert small.match(prompt).tokens == 8 and big.match(prompt).tokens == 8
    other = list(range(12))
    other[0] = 99
    assert small.match(other).tokens == 0 and big.match(other).tokens == 0
