"""Exact tokenization of ASCII text at a fraction of the tokenizer's cost, for byte-level BPE tokenizers (Qwen's).

Such a tokenizer splits its input at its added tokens (`<|im_end|>`, `<tool_response>`, ...), normalizes the text
between them (NFC: nothing to do on ASCII), splits that into words with one regular expression, and runs BPE on
each word alone. Most of its time goes to the regular expression (an Oniguruma `\\p{L}` pattern) and to BPE of words
it has seen many times. On ASCII text the pattern means the same as its ASCII spelling, which Python's `re` runs
several times faster, and a word's tokens depend on the word alone, so they are kept per word. `WordCacheEncoder`
does exactly that and hands only unseen words to the tokenizer's own BPE (the same model, without the split), all of
a text's unseen words in one call: joined by a separator that is not ASCII (so in no word), which that call's
pre-tokenizer removes again, so that BPE still runs on each word alone.

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
WORD_SEPARATOR = "\ue000"  # joins a text's unseen words for one tokenizer call (not ASCII: in no word)
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

    def __init__(self, split: re.Pattern, model, added: dict[str, int], words_model=None) -> None:
        self._split = split
        self._model = model  # the tokenizer's BPE model behind a byte-level mapping, without the word split
        # the same, splitting at WORD_SEPARATOR (removed): several unseen words in one call (None: one by one)
        self._words_model = words_model
        self._added_ids = added
        # leftmost match, the longest at that position (as the tokenizer matches added tokens)
        self._added = (re.compile("|".join(re.escape(token) for token in sorted(added, key=len, reverse=True)))
                       if added else None)
        # word -> its tokens. Tuples, not lists: the collector stops tracking a tuple of ints, so a full collection
        # does not walk every cached word
        self._cache: dict[str, tuple[int, ...]] = {}
        self._segments: dict[str, tuple[int, ...]] = {}  # short text between added tokens -> its tokens

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
        batch = Tokenizer(model)
        batch.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(WORD_SEPARATOR, "removed"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        encoder = cls(ASCII_SPLITS[pattern], bare, added, batch)
        words = list(dict.fromkeys(chain.from_iterable(encoder._split.findall(text) for text in CHECK_TEXTS)))
        if encoder._encode_words(words) != [bare.encode(word, add_special_tokens=False).ids for word in words]:
            log.warning("tokenizing words in one call differs from one call per word; tokenizing them one by one")
            encoder._words_model = None
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
                ids = self._segments[segment] = tuple(pieces)
            out.extend(ids)
            return True
        return self._words_of(segment, out)

    def _words_of(self, segment: str, out: list[int]) -> bool:
        words = self._split.findall(segment)
        if "".join(words) != segment:  # never expected: the pattern covers every character
            return False
        cache = self._cache
        pieces = list(map(cache.get, words))
        missing = pieces.count(None)
        if missing:  # unseen words (a new path, a hash): found by C-level scans, not a Python loop over every word
            where: list[int] = []
            index = -1
            for _ in range(missing):
                index = pieces.index(None, index + 1)
                where.append(index)
            unseen = list(dict.fromkeys([words[index] for index in where]))
            found = dict(zip(unseen, map(tuple, self._encode_words(unseen)), strict=True))
            for index in where:
                pieces[index] = found[words[index]]
            if len(cache) + len(found) > CACHED_WORDS:  # start over, keeping this text's words
                kept = {word: cache[word] for word in set(words).intersection(cache)}
                cache.clear()
                cache.update(kept)
            cache.update(found)
        out.extend(chain.from_iterable(pieces))
        return True

    def _encode_words(self, words: list[str]) -> list[list[int]]:
        """Each word's tokens, by the tokenizer's BPE on that word alone."""
        if len(words) == 1 or self._words_model is None:
            # one word: the plain call. Never `encode_batch`: it wakes the tokenizer's thread pool, which costs more
            # than a few words.
            encode = self._model.encode
            return [encode(word, add_special_tokens=False).ids for word in words]
        encoding = self._words_model.encode(WORD_SEPARATOR.join(words), add_special_tokens=False)
        tokens: list[list[int]] = [[] for _ in words]
        for word, token in zip(encoding.word_ids, encoding.ids, strict=True):
            tokens[word].append(token)
        return tokens
