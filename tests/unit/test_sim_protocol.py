"""The simulated worker's tokenizer and payload shaping (pure parts of the SGLang protocol)."""

from __future__ import annotations

import pytest

from proxy.sim import tokenizer
from proxy.sim.protocol import BadRequest, parse_generate, parse_openai, render_chat


def test_tokenization_is_deterministic_and_counts_four_character_pieces() -> None:
    assert tokenizer.encode("the cat") == tokenizer.encode("the   cat")
    assert len(tokenizer.encode("a abcd abcde", add_bos=False)) == 4  # a | abcd | abcd e
    assert tokenizer.encode("x")[0] == tokenizer.BOS_ID
    assert all(0 <= t < tokenizer.VOCAB_SIZE for t in tokenizer.encode("hello world", add_bos=False))


def test_output_depends_only_on_the_prompt_and_retokenizes_to_the_same_ids() -> None:
    seed = tokenizer.output_seed([1, 2, 3])
    ids, words = zip(*(tokenizer.output_token(seed, k) for k in range(20)), strict=True)
    again = [tokenizer.output_token(tokenizer.output_seed([1, 2, 3]), k)[0] for k in range(20)]
    assert list(ids) == again
    assert tokenizer.encode(" ".join(words), add_bos=False) == list(ids)
    assert tokenizer.decode_output(list(ids)) == " ".join(words)
    other = [tokenizer.output_token(tokenizer.output_seed([1, 2, 4]), k)[0] for k in range(20)]
    assert other != list(ids)


def test_generate_accepts_text_or_input_ids_with_sglang_defaults() -> None:
    req, stream = parse_generate({"text": "hello there"})
    assert not stream and req.max_new_tokens == 128 and req.input_ids == tokenizer.encode("hello there")
    req, stream = parse_generate({"input_ids": [5, 6], "stream": True, "rid": "r1",
                                  "sampling_params": {"max_new_tokens": 3, "stop": "x", "ignore_eos": True}})
    assert stream and req.rid == "r1" and req.input_ids == [5, 6] and req.stop == ("x",)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": "a", "input_ids": [1]},
        {"text": ["a", "b"]},
        {"input_ids": []},
        {"text": "a", "sampling_params": {"max_new_tokens": -1}},
        {"text": "a", "sampling_params": {"stop": 3}},
        [1, 2],
    ],
)
def test_malformed_generate_bodies_are_rejected(body: object) -> None:
    with pytest.raises(BadRequest):
        parse_generate(body)


def test_chat_turn_n_plus_one_extends_turn_n_token_for_token() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    prompt1 = tokenizer.encode(render_chat(turn1))
    answer = " ".join(tokenizer.output_word(tokenizer.output_seed(prompt1), k) for k in range(5))
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    prompt2 = tokenizer.encode(render_chat(turn2))
    answer_ids = [tokenizer.output_token(tokenizer.output_seed(prompt1), k)[0] for k in range(5)]
    assert prompt2[: len(prompt1)] == prompt1
    assert prompt2[len(prompt1) : len(prompt1) + 5] == answer_ids


def test_openai_defaults_and_usage_options() -> None:
    req, stream, usage = parse_openai({"prompt": "hi"}, chat=False)
    assert req.max_new_tokens == 16 and not stream and not usage
    req, stream, usage = parse_openai({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                       "stream": True, "stream_options": {"include_usage": True},
                                       "max_completion_tokens": 7}, chat=True)
    assert req.max_new_tokens == 7 and stream and usage
    with pytest.raises(BadRequest):
        parse_openai({"messages": []}, chat=True)


def test_a_sim_config_round_trips_through_the_command_line() -> None:
    from proxy.sim.__main__ import parse_args, parse_cli
    from proxy.sim.config import SimConfig
    from proxy.sim.fleet import cli_args

    config = SimConfig(port=0, profile="zero", time_scale=7.5, enable_metrics=True, max_running_requests=3,
                       page_size=16, schedule_policy="lpm", chunked_prefill_size=-1, max_queued_requests=9,
                       stream_interval=2, incremental_streaming_output=True, worker_id="w1",
                       fault_error_rate=0.25, fault_fail_health=True, fault_die_after_tokens=5,
                       minimal_reports=True, profile_set=("step_overhead_s=0.01", "mfu=0.3"))
    assert parse_args(cli_args(config)) == config
    assert parse_args(cli_args(SimConfig(port=0))) == SimConfig(port=0)
    assert parse_cli([*cli_args(config), "--count", "4", "--shared-gpu"]) == (config, 4, True)


def test_a_bad_profile_setting_is_refused_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    from proxy.sim.__main__ import parse_args

    for bad, named in (("mfu=fast", "mfu"), ("no_such_field=1", "no_such_field"), ("model=x", "model"),
                       ("evict_most_recent=maybe", "evict_most_recent")):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--profile-set", bad])
        assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_chat_through_a_chat_template_and_its_refusal_as_a_400() -> None:
    from proxy.routing.chat_template import ChatTemplate

    template = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    req, _, _ = parse_openai(body, chat=True,
                             encode_chat=lambda msgs: tokenizer.encode(template.render(msgs), add_bos=False))
    assert req.input_ids == tokenizer.encode("user: hello there\n", add_bos=False)
    plain, _, _ = parse_openai(body, chat=True)  # no template: the worker's own rendering
    assert plain.input_ids == tokenizer.encode(render_chat(body["messages"]))
    refusing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(BadRequest, match="roles must alternate"):
        parse_openai(body, chat=True, encode_chat=lambda msgs: tokenizer.encode(refusing.render(msgs)))


def test_a_worker_runs_on_its_profile_settings() -> None:
    from proxy.sim.config import SimConfig
    from proxy.sim.server import SimWorker

    worker = SimWorker(SimConfig(profile="h200-transformers-7b-slices", profile_set=("step_overhead_s=0.035",
                                                                                      "safety_margin=0.2")))
    assert worker.engine.profile.step_overhead_s == 0.035
    assert worker.engine.scheduler.limits.safety_margin == 0.2  # the scheduler is built from the set profile
