"""The model's chat template, rendered as the engines render it, inside Jinja's sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.routing.chat_template import ChatTemplate, ChatTemplateError
from proxy.routing.tokenizer import PromptTokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtests" / "gpu" / "tokenizer"
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHAT = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi"}]


def test_a_llama3_style_template_renders_byte_for_byte() -> None:
    t = ChatTemplate(LLAMA3, bos_token="<|begin_of_text|>")
    assert t.render(CHAT) == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert not t.render(CHAT, add_generation_prompt=False).endswith("assistant<|end_header_id|>\n\n")


def test_text_parts_are_joined_as_for_a_string_content_template() -> None:
    t = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]}]
    assert t.render(parts, add_generation_prompt=False) == "[a b]"


def test_the_templates_helpers_are_there_and_its_refusal_is_an_error() -> None:
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
                     "{{ messages | tojson }}")
    assert json.loads(t.render([{"role": "user", "content": "é"}])) == [{"role": "user", "content": "é"}]
    with pytest.raises(ChatTemplateError, match="user first"):
        t.render(CHAT)


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",            # no reaching Python internals
    "{% set _ = messages.append(1) %}{{ messages }}",  # no mutating the client's messages
    "{{ messages[5].content }}x{{ nope.attr }}",   # an undefined dereferenced
    "{{ messages | length // 0 }}",                # whatever else the template raises
])
def test_what_the_sandbox_refuses_is_a_template_error(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(CHAT)


def test_a_template_that_does_not_compile_is_refused_at_load() -> None:
    with pytest.raises(ChatTemplateError, match="compile"):
        ChatTemplate("{% for m in messages %}")


def test_a_tokenizer_directory_gives_its_template(tmp_path: Path) -> None:
    assert ChatTemplate.from_dir(str(tmp_path)) is None  # none there
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>"}, "chat_template": [{"name": "tool_use", "template": "T"},
                                                           {"name": "default", "template": "{{ bos_token }}D"}]}))
    named = ChatTemplate.from_dir(str(tmp_path))
    assert named is not None and named.render(CHAT) == "<s>D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")  # the newer layout wins
    file = ChatTemplate.from_dir(str(tmp_path))
    assert file is not None and file.render(CHAT) == "J2"


def test_chat_prompts_get_the_template_once_and_no_second_bos() -> None:
    tok = PromptTokenizer(str(TOKENIZER))
    assert tok.chat is not None
    ids = tok.encode_chat(CHAT)
    assert ids is not None
    text = tok.chat.render(CHAT)
    bos = tok.encode("")  # the post-processor's special tokens alone
    assert bos and ids == tok.encode(text)[len(bos):]  # the template wrote the BOS itself
    assert ids.count(bos[0]) == 1
    refusing = PromptTokenizer(str(TOKENIZER))
    refusing.chat = ChatTemplate("{{ raise_exception('no') }}")
    assert refusing.encode_chat(CHAT) is None  # the proxy falls back to byte keys; the engine answers
