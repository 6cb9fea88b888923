"""Exact tokenization of ASCII text at a fraction of the tokenizer's cost, for byte-level BPE tokenizers (Qwen's).

Such a tokenizer splits its input at its added tokens (`<|im_end|>`, `<tool_response>`, ...), normalizes the text
between them (NFC: nothing to do on ASCII), splits that into words with one regular expression, and runs BPE on
each word alone. Most of its time goes to the regular expression (an Oniguruma `\\p{L}` pattern) and to BPE of words
it has seen many times. On ASCII text the pattern means the same as its ASCII spelling, which Python's `re` runs
several times faster, and a word's tokens depend on the word alone, so they are kept per word. `WordCacheEncoder`
does exactly that and hands only unseen words to the tokenizer's own BPE (the same model, without the split).

It applies only where that is exact: a tokenizer whose split pattern is a known one, whose normalizer leaves ASCII
as it is, whose added tokens match anywhere (no single-word or strip rules), and only to ASCII text (anything else
goes to the tokenizer). `for_tokenizer` also compares it with the tokenizer on texts that exercise the pattern
before using it. Tests compare it with the tokenizer on random ASCII.
"""

from __future__ import annotations

import json
import logging
import re
from itertools import chain

log = logging.getLogger(__name__)

# Qwen2/Qwen3 (and cl100k-style) word split, as tokenizer.json spells it, and its meaning on ASCII text.
QWEN_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
ASCII_SPLITS = {
    QWEN_SPLIT: re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|"
                           r"\s*[\r\n]+|\s+(?!\S)|\s+", re.ASCII),
}
ASCII_NORMALIZERS = {None, "NFC", "NFD", "NFKC", "NFKD"}  # each leaves ASCII text unchanged
CACHED_WORDS = 200_000  # words whose tokens an encoder keeps (then it starts over)
SHORT_SEGMENT = 32  # texts between added tokens this short are kept whole, beside the words
CHECK_TEXTS = (
    "".join(chr(code) for code in range(128)),
    "It's THEY'RE we'Ll I'M you'VE he'd 'S 's' x's\n\n  \t \r\n\r\n   end  ",
    "def f(x):\n    return x**2 + 1_000  # 12345 \u0041BC\n\n\n\tfoo.bar(baz)[0] != 'q'\r\n",
    "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n",
    "    \n    \n  x  \n\n\t\t\n   ",
    "a<|im_end|>b<|im_end|><|im_end|>  <tool_call>\n{\"name\": \"bash\"}\n</tool_call>",
)


class WordCacheEncoder:
    """Tokens of ASCII text, as the tokenizer gives them (see the module docstring). Build it with `for_tokenizer`."""

    def __init__(self, split: re.Pattern, model, added: dict[str, int]) -> None:
        self._split = split
        self._model = model  # the tokenizer's BPE model behind a byte-level mapping, without the word split
        self._added_ids = added
        # leftmost match, the longest at that position (as the tokenizer matches added tokens)
        self._added = (re.compile("|".join(re.escape(token) for token in sorted(added, key=len, reverse=True)))
                       if added else None)
        self._cache: dict[str, list[int]] = {}  # word -> its tokens
        self._segments: dict[str, list[int]] = {}  # short text between added tokens -> its tokens

    @classmethod
    def for_tokenizer(cls, tokenizer) -> WordCacheEncoder | None:
        """An encoder for `tokenizer` (a `tokenizers.Tokenizer`), or None when it cannot be exact for it."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        def state(component) -> dict:
            return json.loads(component.__getstate__()) if component is not None else {}

        try:
            pre, normalizer = state(tokenizer.pre_tokenizer), state(tokenizer.normalizer)
            model, added_tokens = tokenizer.model, tokenizer.get_added_tokens_decoder().values()
        except Exception:  # not a Rust tokenizer whose parts can be read
            return None
        steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
        if not steps or len(steps) != 2:
            return None
        split, byte_level = steps
        pattern = (split.get("pattern") or {}).get("Regex")
        if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
                or pattern not in ASCII_SPLITS):
            return None
        if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
            return None
        if normalizer.get("type") not in ASCII_NORMALIZERS or not isinstance(model, models.BPE) or model.dropout:
            return None
        added = {}
        for token in added_tokens:
            if token.single_word or token.lstrip or token.rstrip:
                return None
            added[token.content] = tokenizer.token_to_id(token.content)
        bare = Tokenizer(model)  # the same BPE model, reached without the split, the normalizer or added tokens
        bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        encoder = cls(ASCII_SPLITS[pattern], bare, added)
        for text in CHECK_TEXTS:
            if encoder.encode(text) != tokenizer.encode(text, add_special_tokens=False).ids:
                log.warning("the word-cache tokenizer differs from the tokenizer on a check text; not using it")
                return None
        encoder._cache.clear()
        encoder._segments.clear()
        return encoder

    def encode(self, text: str) -> list[int] | None:
        """The token ids of `text`, or None when it is not ASCII (ask the tokenizer)."""
        if not text.isascii():
            return None
        out: list[int] = []
        position = 0
        if self._added is not None:
            for match in self._added.finditer(text):
                if not self._words(text[position:match.start()], out):
                    return None
                out.append(self._added_ids[match.group()])
                position = match.end()
        if not self._words(text[position:], out):
            return None
        return out

    def _words(self, segment: str, out: list[int]) -> bool:
        if not segment:
            return True
        if len(segment) <= SHORT_SEGMENT:  # template text between added tokens ("\n", "assistant\n"): seen whole
            ids = self._segments.get(segment)
            if ids is None:
                pieces: list[int] = []
                if not self._words_of(segment, pieces):
                    return False
                if len(self._segments) >= CACHED_WORDS:
                    self._segments.clear()
                ids = self._segments[segment] = pieces
            out.extend(ids)
            return True
        return self._words_of(segment, out)

    def _words_of(self, segment: str, out: list[int]) -> bool:
        words = self._split.findall(segment)
        if "".join(words) != segment:  # never expected: the pattern covers every character
            return False
        cache = self._cache
        pieces = list(map(cache.get, words))
        if None in pieces:  # unseen words (a new path, a hash): tokenized one by one
            # one word at a time: a batch would wake the tokenizer's thread pool, which costs more than a few words
            encode = self._model.encode
            found: dict[str, list[int]] = {}
            for index, piece in enumerate(pieces):
                if piece is None:
                    word = words[index]
                    piece = found.get(word)
                    if piece is None:
                        piece = found[word] = encode(word, add_special_tokens=False).ids
                    pieces[index] = piece
            if len(cache) + len(found) > CACHED_WORDS:  # start over, keeping this text's words
                kept = {word: cache[word] for word in set(words).intersection(cache)}
                cache.clear()
                cache.update(kept)
            cache.update(found)
        out.extend(chain.from_iterable(pieces))
        return True
