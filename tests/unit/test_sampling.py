"""The sampling table both frontends check (frontends/sampling.py)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import BadRequest
from proxy.frontends.sampling import check_sampling


@pytest.mark.parametrize(("params", "field"), [
    ({"max_new_tokens": float("inf")}, "max_new_tokens"),
    ({"max_new_tokens": "many"}, "max_new_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 2**31}, "max_new_tokens"),
    ({"max_tokens": 10**400}, "max_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": -0.1}, "min_p"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"n": 0}, "n"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"),
    ({"stop_token_ids": "1"}, "stop_token_ids"),
])
def test_a_value_no_worker_accepts_is_refused_naming_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest, match=rf"^sampling_params\.{field}: "):
        check_sampling(params, "sampling_params.")


@pytest.mark.parametrize("params", [
    {}, {"max_new_tokens": 16, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0},
    {"max_tokens": None, "temperature": 0.7, "stop": "\n", "stop_token_ids": [2, 3], "seed": -5},
    {"max_new_tokens": 8.0, "repetition_penalty": 2, "n": 2, "ignore_eos": False},
    {"some_new_sglang_knob": float("inf"), "regex": "[a-z]+"},  # not in the table: the worker judges
])
def test_values_workers_accept_and_unknown_keys_pass(params: dict[str, Any]) -> None:
    check_sampling(params, "")


def test_names_map_a_key_back_to_what_the_caller_wrote() -> None:
    with pytest.raises(BadRequest, match=r"^sampling\.seed: "):
        check_sampling({"sampling_seed": 2**70}, "sampling.", names={"sampling_seed": "seed"})
