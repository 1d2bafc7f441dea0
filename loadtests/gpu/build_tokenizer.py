"""Build the benchmark's BPE tokenizer: byte-level BPE trained offline on ``proxy.loadgen.texts``.

No network reaches the GPU machine, and a real model's tokenizer is not needed for timing (the
engine runs random weights); what routing needs is a real BPE whose characters per token differ
from the proxy's 4.0 heuristic and differ by kind of text, as Llama's or Qwen's do. The output
directory holds ``tokenizer.json`` (loadable by ``tokenizers``, transformers, smg and
sglang-router through ``--tokenizer-path``) and ``tokenizer_config.json`` with a chat template.
Training is deterministic for a given corpus and vocabulary size.

    python -m loadtests.gpu.build_tokenizer [--out loadtests/gpu/tokenizer] [--vocab 16000]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from proxy.loadgen import texts

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama-3 style: every message is header + content + end-of-turn, so turn n+1 extends turn n.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def build(out: Path, vocab: int, corpus_chars: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts.corpus(corpus_chars), trainer=trainer)
    bos = tok.token_to_id(SPECIAL[0])
    tok.post_processor = processors.TemplateProcessing(single=f"{SPECIAL[0]} $A", special_tokens=[(SPECIAL[0], bos)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL[0], "eos_token": SPECIAL[4], "chat_template": CHAT_TEMPLATE,
        "model_max_length": 32768, "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=1) + "\n")


def chars_per_token(path: Path, seed: int = 7) -> dict[str, float]:
    """Characters per token by kind of text, and for the mix (held-out text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    rng = random.Random(seed)
    out: dict[str, float] = {}
    for kind in (*texts.KINDS, "mixed"):
        text = texts.mixed_text(rng, 40_000) if kind == "mixed" else texts.text_of(kind, rng, 40_000)
        n = len(tok.encode(text, add_special_tokens=False).ids)
        out[kind] = round(len(text) / n, 2)
        out[f"{kind}_bytes"] = round(len(text.encode()) / n, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "tokenizer")
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--corpus-chars", type=int, default=6_000_000)
    a = p.parse_args()
    build(a.out, a.vocab, a.corpus_chars)
    print(json.dumps(chars_per_token(a.out)))


if __name__ == "__main__":
    main()
