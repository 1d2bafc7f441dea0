"""The GPU engine shim's KV events: a stand-in for transformers' block table, diffed into
SGLang's events, decoded by the proxy's own KV-event reader and matched by its index."""

from __future__ import annotations

from loadtests.gpu.kv_tracker import BlockChains, KvTracker
from loadtests.gpu.kv_tracker import engine_hash as shim_hash
from proxy.routing.kv_index import EngineBlocks, chain_keys
from proxy.sim.kv_publish import encode_batch
from proxy.workers.kv_events import decode_batch


def engine_hash(parent: int | None, tokens: list[int]) -> int:
    return hash((parent, tuple(tokens)))  # transformers' BlockManager.compute_hash


def test_blocks_the_engine_completes_are_stored_in_chain_order_and_evictions_removed() -> None:
    chains = BlockChains(engine_hash, block_size=4)
    prompt = list(range(100, 111))  # 2 complete blocks and 3 tokens left over
    chains.add_prompt(prompt)
    h0 = engine_hash(None, prompt[0:4])
    h1 = engine_hash(h0, prompt[4:8])
    tracker = KvTracker(chains)
    # the engine's table after the prefill: both blocks, plus one of generated tokens we cannot name
    events = tracker.diff([h1, 12345, h0])
    assert events == [["BlockStored", [h0], None, prompt[0:4], 4, None],
                      ["BlockStored", [h1], h0, prompt[4:8], 4, None]]
    assert tracker.diff([h0, h1, 12345]) == []  # nothing new
    assert tracker.diff([h0]) == [["BlockRemoved", [h1]]]  # evicted
    assert tracker.cleared() == [["AllBlocksCleared"]] and tracker.diff([]) == []


def test_the_proxys_reader_and_index_take_the_shims_events_as_an_engines() -> None:
    chains = BlockChains(engine_hash, block_size=16)
    system = [7] * 64
    prompts = [system + [i] * 20 for i in range(3)]
    for p in prompts:
        chains.add_prompt(p)
    tracker = KvTracker(chains)
    present = [engine_hash(None, system[:16])]
    for k in range(1, 4):
        present.append(engine_hash(present[-1], system[16 * k:16 * (k + 1)]))
    events = tracker.diff(present)
    batch = decode_batch(encode_batch(events))  # the wire SGLang and the simulator use
    table = EngineBlocks(16)
    for event in batch.events:
        table.apply(event)
    # a new prompt on the same system prompt matches its 4 blocks (64 tokens) there
    assert table.matched_blocks(chain_keys(system + [9] * 30, 16)) == 4


def test_the_chain_map_is_bounded() -> None:
    chains = BlockChains(engine_hash, block_size=2, capacity=5)
    chains.add_prompt(list(range(20)))  # 10 blocks
    assert chains.get(engine_hash(None, [0, 1])) is None  # the oldest went
    assert len(chains._blocks) == 5


class GroupedBlockManager:
    """transformers' later BlockManager: the hash also names the layer group."""

    def compute_hash(self, parent_hash: int | None, tokens: list[int], group_id: int) -> int:
        return hash((parent_hash, tuple(tokens), group_id))


def test_the_shim_hashes_as_either_release_of_the_engine_does() -> None:
    grouped = GroupedBlockManager()
    prompt = list(range(8))
    # 5.17's three-argument hash, group 0 (a model of full-attention layers only)
    h0 = grouped.compute_hash(None, prompt[:4], 0)
    chains = BlockChains(shim_hash(grouped.compute_hash), block_size=4)
    chains.add_prompt(prompt)
    tracker = KvTracker(chains)
    stored = tracker.diff([h0, grouped.compute_hash(h0, prompt[4:], 0)])
    assert [e[0] for e in stored] == ["BlockStored", "BlockStored"] and tracker.unknown == 0
    # the two-argument hash of earlier releases is taken as it is
    assert shim_hash(engine_hash) is engine_hash
    # a hash the shim computes wrongly names nothing, and says how much it could not name
    wrong = KvTracker(BlockChains(engine_hash, block_size=4))
    wrong.chains.add_prompt(prompt)
    assert wrong.diff([h0]) == [] and wrong.unknown == 1
