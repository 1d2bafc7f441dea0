"""A deterministic stand-in tokenizer and a deterministic "model" output.

Rule: text is split on whitespace; every word is cut into pieces of at most 4 characters; each
piece is one token whose id is ``xxh32(piece) % VOCAB_SIZE`` (ids below ``BOS_ID``). Whitespace
itself makes no token, so token counts depend only on the words (English prose averages ~1.3
tokens per word, close to Llama-3's BPE). Text input gets a BOS token in front, as Llama's
tokenizer adds ``<|begin_of_text|>``.

Output: the k-th generated token of a request is a word from a fixed list of short words, chosen
by ``xxh32(seed, k)`` where the seed is a hash of the prompt's token ids. The same prompt always
yields the same output; every output word is one token, so re-tokenizing an answer that a client
sends back (a multi-turn chat) reproduces the generated ids and hits the prefix cache.
"""

from __future__ import annotations

from typing import Any

import xxhash

VOCAB_SIZE = 128_000  # Llama-3 has 128,256 ids; the top 256 are special tokens
BOS_ID = 128_000
PIECE_CHARS = 4

OUTPUT_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "be",
    "at", "by", "this", "from", "or", "an", "are", "not", "but", "all", "can", "one", "has",
    "more", "will", "so", "out", "up", "into", "time", "data", "cat", "run", "fast", "node",
    "tree", "page", "gpu", "load", "path", "word", "list", "ok", "yes", "sun", "sky", "sea",
)


def _piece_id(piece: str) -> int:
    return xxhash.xxh32_intdigest(piece.encode()) % VOCAB_SIZE


_WORD_BY_ID = {_piece_id(w): w for w in OUTPUT_WORDS}
assert len(_WORD_BY_ID) == len(OUTPUT_WORDS), "output words must have distinct ids"


def pieces(text: str) -> list[str]:
    out: list[str] = []
    for word in text.split():
        out.extend(word[i : i + PIECE_CHARS] for i in range(0, len(word), PIECE_CHARS))
    return out


def encode(text: str, add_bos: bool = True) -> list[int]:
    ids = [_piece_id(p) for p in pieces(text)]
    return [BOS_ID, *ids] if add_bos else ids


# Seeds of prompts seen, by the hash of their ids (a bounded table of ints: a table keyed by the
# ids themselves would keep every long prompt alive): a replay makes a request of every prompt
# again, and the joined text of a 3,000-token prompt costs 20 times what hashing its ids does (a
# sixth of a replay's time). Two prompts whose hashes collide share a seed: their output words.
_SEEDS: dict[int, int] = {}
_SEEDS_KEPT = 4096


def output_seed(prompt_ids: list[int]) -> int:
    key = hash(tuple(prompt_ids))
    seed = _SEEDS.get(key)
    if seed is None:
        seed = xxhash.xxh64_intdigest(",".join(map(str, prompt_ids)).encode())
        if len(_SEEDS) >= _SEEDS_KEPT:
            _SEEDS.clear()
        _SEEDS[key] = seed
    return seed


def output_word(seed: int, index: int) -> str:
    key = seed.to_bytes(8, "little") + index.to_bytes(4, "little")
    return OUTPUT_WORDS[xxhash.xxh32_intdigest(key) % len(OUTPUT_WORDS)]


def output_token(seed: int, index: int) -> tuple[int, str]:
    word = output_word(seed, index)
    return _piece_id(word), word


def decode_output(ids: list[int]) -> str:
    """Text of generated ids (words joined by single spaces); unknown ids render as ``<id>``."""
    return " ".join(_WORD_BY_ID.get(i, f"<{i}>") for i in ids)


class Encoder:
    """Text -> token ids: this module's deterministic tokenizer, or a Hugging Face BPE.

    ``Encoder(None)`` is the fast default; ``Encoder(path)`` loads ``tokenizer.json`` (a file, or a
    directory holding one) with the ``tokenizers`` library and adds its post-processor's special
    tokens (BOS), as the engine's tokenizer does, so prompt token counts, page alignment and
    prefix matches follow a real vocabulary.
    """

    chat: Any = None  # the directory's ChatTemplate, if it has one

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._bpe = None
        self.vocab_size = VOCAB_SIZE + 256
        if path:
            import os

            try:
                from tokenizers import Tokenizer
            except ImportError as e:  # an optional dependency: the default tokenizer needs none
                raise RuntimeError("a tokenizer.json needs the tokenizers package: "
                                   "pip install 'radixgate[bpe]'") from e

            file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
            self._bpe = Tokenizer.from_file(file)
            self.vocab_size = self._bpe.get_vocab_size(with_added_tokens=True)
            from proxy.routing.chat_template import ChatTemplate

            # The directory's chat template renders chat prompts, as SGLang's tokenizer manager does.
            self.chat = ChatTemplate.from_dir(path)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._bpe is None:
            return encode(text, add_bos=add_special_tokens)
        return list(self._bpe.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Token ids back to text: the BPE's own decoding; the default tokenizer hashes prompt
        pieces (not invertible), so it decodes the words it generates and renders any other id as
        ``<id>`` (BOS dropped when ``skip_special_tokens``)."""
        if self._bpe is not None:
            return str(self._bpe.decode(ids, skip_special_tokens=skip_special_tokens))
        return decode_output([i for i in ids if not (skip_special_tokens and i == BOS_ID)])

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int] | None:
        """A chat prompt through the tokenizer's chat template, special tokens left to it (None
        without a template: the caller renders the turns its own way). ``ChatTemplateError``
        when the template refuses the messages."""
        if self.chat is None or self._bpe is None:
            return None
        return list(self._bpe.encode(self.chat.render(messages), add_special_tokens=False).ids)
