"""The roofline time model: monotonic in tokens and batch, cached prefixes cheap, profiles sane."""

from __future__ import annotations

import pytest

from proxy.sim.perf import PROFILES, PrefillChunk, StepWork, step_seconds

PHYSICAL = [name for name in PROFILES if name != "zero"]


@pytest.mark.parametrize("name", PHYSICAL)
def test_prefill_time_grows_with_new_tokens(name: str) -> None:
    p = PROFILES[name]
    times = [step_seconds(p, StepWork(prefill=[PrefillChunk(n, 0)])) for n in (1, 64, 512, 4096, 16384)]
    assert times == sorted(times)
    # past the step's fixed cost the time follows the tokens: the 12,288 tokens from 4,096 to 16,384
    # cost more than twice the 4,032 from 64 to 4,096 (a host-bound profile's ratio to the 64-token
    # step says little: the 16-layer one's is 7x)
    assert times[-1] - times[-2] > 2 * (times[-2] - times[1]) > 0


@pytest.mark.parametrize("name", PHYSICAL)
def test_decode_time_grows_with_batch_and_context(name: str) -> None:
    p = PROFILES[name]
    by_batch = [step_seconds(p, StepWork(decode_contexts=[1000] * b)) for b in (1, 8, 64, 256)]
    assert by_batch == sorted(by_batch) and by_batch[-1] > by_batch[0]
    by_context = [step_seconds(p, StepWork(decode_contexts=[c] * 32)) for c in (100, 10_000, 100_000)]
    assert by_context == sorted(by_context) and by_context[-1] > by_context[0]


@pytest.mark.parametrize("name", PHYSICAL)
def test_a_cached_prefix_costs_no_linear_flops_but_is_still_attended(name: str) -> None:
    p = PROFILES[name]
    cold = step_seconds(p, StepWork(prefill=[PrefillChunk(8256, 0)]))
    warm = step_seconds(p, StepWork(prefill=[PrefillChunk(64, 8192)]))
    tiny = step_seconds(p, StepWork(prefill=[PrefillChunk(64, 0)]))
    # measured past the step's fixed cost (the 64-token step), which a host-bound profile is mostly
    assert warm - tiny < (cold - tiny) / 3
    assert warm > tiny


@pytest.mark.parametrize("name", PHYSICAL)
def test_a_mixed_step_costs_at_least_each_part(name: str) -> None:
    p = PROFILES[name]
    prefill = StepWork(prefill=[PrefillChunk(2048, 0)])
    decode = StepWork(decode_contexts=[2000] * 64)
    mixed = StepWork(prefill=prefill.prefill, decode_contexts=decode.decode_contexts)
    assert step_seconds(p, mixed) >= max(step_seconds(p, prefill), step_seconds(p, decode))


def test_decode_is_memory_bound_so_h200_beats_h100() -> None:
    work = StepWork(decode_contexts=[2000])
    assert step_seconds(PROFILES["llama-3.1-8b-h200"], work) < step_seconds(PROFILES["llama-3.1-8b-h100"], work)


def test_the_first_step_pays_the_warmup() -> None:
    p = PROFILES["h200-transformers-7b"]
    work = StepWork(prefill=[PrefillChunk(256, 0)])
    first = StepWork(prefill=work.prefill, first_step=True)
    assert step_seconds(p, first) == pytest.approx(step_seconds(p, work) + p.warmup_s)


def test_the_zero_profile_takes_no_time() -> None:
    work = StepWork(prefill=[PrefillChunk(8000, 0)], decode_contexts=[100] * 10, first_step=True)
    assert step_seconds(PROFILES["zero"], work) == 0.0


def test_an_empty_step_takes_no_time() -> None:
    assert step_seconds(PROFILES["llama-3.1-8b-h100"], StepWork()) == 0.0


@pytest.mark.parametrize("name", ["llama-3.1-8b-h100", "llama-3.1-8b-h200"])
def test_the_kv_pool_is_what_is_left_after_the_weights(name: str) -> None:
    p = PROFILES[name]
    pool_bytes = p.kv_pool_tokens * p.model.kv_bytes_per_token
    assert p.model.kv_bytes_per_token == 131072  # 2 x 32 layers x 8 kv heads x 128 dims x 2 bytes
    assert 0 < pool_bytes < p.gpu.memory_bytes - p.model.weight_bytes


def test_a_profile_overridden_field_by_field_keeps_the_rest() -> None:
    from proxy.sim.perf import overridden

    base = PROFILES["h200-transformers-7b-slices"]
    fitted = overridden(base, ["step_overhead_s=0.035", "seq_overhead_s=0.00335", "kv_read_budget=40000",
                               "evict_most_recent=False", "gpu_sharing=fcfs"])
    assert (fitted.step_overhead_s, fitted.seq_overhead_s, fitted.kv_read_budget) == (0.035, 0.00335, 40000)
    assert isinstance(fitted.kv_read_budget, int) and fitted.evict_most_recent is False
    assert fitted.gpu_sharing == "fcfs" and fitted.mfu == base.mfu and fitted.model == base.model
    work = StepWork(decode_contexts=[3000] * 8)
    assert step_seconds(fitted, work) < step_seconds(base, work)  # a cheaper step, as set
    for bad in ("mfu", "mfu=fast", "name=x", "nope=1"):
        with pytest.raises(ValueError, match="profile setting"):
            overridden(base, [bad])


def test_dense_attention_makes_a_prompt_dear_beside_many_decodes() -> None:
    # The served engine's batch logs: a prompt token costs 2.3-2.5x more in a step with 8+ decodes
    # than in one with 0-2 (runs 57-59), because its attention runs against every key the step
    # gathers; the per-sequence model prices it the same beside any batch.
    def marginal(profile_name: str, decodes: int) -> float:
        p = PROFILES[profile_name]
        beside = [3000] * decodes
        with_prompt = StepWork(prefill=[PrefillChunk(1000, 0)], decode_contexts=beside)
        return step_seconds(p, with_prompt) - step_seconds(p, StepWork(decode_contexts=beside or [1]))

    dense = marginal("h200-transformers-7b-dense", 14) / marginal("h200-transformers-7b-dense", 0)
    per_sequence = marginal("h200-transformers-7b-slices", 14) / marginal("h200-transformers-7b-slices", 0)
    assert dense > 2.0
    assert per_sequence < 1.3
