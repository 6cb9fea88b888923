"""Exact tokenization of ASCII text at a fraction of the tokenizer's cost, for byte-level BPE tokenizers (Qwen's).

Such a tokenizer splits its input at its added tokens (`<|im_end|>`, `<tool_response>`, ...), normalizes the text
between them (NFC: nothing to do on ASCII), splits that into words with one regular expression, and runs BPE on
each word alone. Most of its time goes to the regular expression (an Oniguruma `\\p{L}` pattern) and to BPE of words
it has seen many times. On ASCII text the pattern means the same as its ASCII spelling, which Python's `re` runs
several times faster, and a word's tokens depend on the word alone, so they are kept per word. `WordCacheEncoder`
does exactly that and hands only unseen words to the tokenizer's own BPE model (`Model.tokenize` of the word's
bytes as the byte-level step maps them: what the tokenizer does for one word, without an encoding built around it).

It applies only where that is exact: a tokenizer whose split pattern is a known one, whose normalizer leaves ASCII
as it is, whose added tokens match anywhere (no single-word or strip rules), and only to ASCII text (anything else
goes to the tokenizer). `for_tokenizer` also compares it with the tokenizer on texts that exercise the pattern
before using it. Tests compare it with the tokenizer on random ASCII.

Splitting every text into words with the pattern is still most of the cost, and most of a new text's words come in
runs the process has seen before (a test log's lines, a file read back, the same error in eight rollouts). So a text
is first cut into *units* with `str.replace` and `str.split`, and a unit's tokens are kept whole. A cut is
- before every space that follows a character that is not whitespace: no pre-token of the pattern holds a space
  after its first character unless that space follows whitespace, so the pattern starts a pre-token there; and
- after a newline, before a character that is not whitespace: no pre-token holds a newline followed by such a
  character (an optional leading character is never a newline; newlines end punctuation or whitespace runs).
A pre-token that ends just before a cut ends the same way at the end of a text: letters, digits and punctuation stop
at a space or a non-whitespace character as at the end, a run of newlines stops at a character that is not one, and
a whitespace run cannot end before a space cut (the character there is not whitespace). The pattern has no
lookbehind, so each unit is tokenized alone as it is in the text. The spaces that are not cuts (after whitespace:
indentation, runs of spaces) are marked first, so that every space left is a cut and the text is split at them
(`str.split(" ")`, which drops the space: a unit is kept under its text after the space). A cut after a newline
becomes a space too, followed by a mark that says the unit has no space before it; so does the first unit. Both
marks are ASCII control characters, so the marked text stays one byte per character, and a text that has either is
tokenized by words. Tokens are kept as the bytes of int32 arrays, so a text's tokens are one `bytes.join`, read into
an array in one copy.
"""

from __future__ import annotations

import json
import logging
import re
from array import array
from itertools import chain
from operator import attrgetter

log = logging.getLogger(__name__)

# Qwen2/Qwen3 (and cl100k-style) word split, as tokenizer.json spells it, and its meaning on ASCII text.
QWEN_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
ASCII_SPLITS = {
    QWEN_SPLIT: re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|"
                           r"\s*[\r\n]+|\s+(?!\S)|\s+", re.ASCII),
}
ASCII_NORMALIZERS = {None, "NFC", "NFD", "NFKC", "NFKD"}  # each leaves ASCII text unchanged
CACHED_WORDS = 200_000  # words (and, apart, units) whose tokens an encoder keeps (then it starts over)
# Longer words and units are tokenized each time, not kept: a text without spaces (a base64 blob, minified JSON) is
# one unit, and keeping such ones would let the cache's memory grow with the texts' length, not only their number.
CACHED_CHARS = 128
SHORT_SEGMENT = 32  # texts between added tokens this short are kept whole, beside the words
# Marks in a text being cut into units: a space that is not a cut (it follows whitespace), and the start of a unit
# with no space before it (after a newline, and the first). ASCII, so that the marked text stays one byte per
# character; a text that has either is tokenized by words instead.
HELD_SPACE, NO_SPACE = "\x00", "\x01"
# whitespace other than a space, then a space (a space after a space is held in two passes of its own)
_WHITESPACE_THEN_SPACE = tuple(f"{c} " for c in "\t\n\r\x0b\x0c")
_LINE_CUT = " " + NO_SPACE  # a cut after a newline
_NOT_BEFORE = "\t\n\r\x0b\x0c" + HELD_SPACE  # no cut after a newline before these (whitespace)
_TOKEN_ID = attrgetter("id")
CHECK_TEXTS = (
    "".join(chr(code) for code in range(128)),
    "It's THEY'RE we'Ll I'M you'VE he'd 'S 's' x's\n\n  \t \r\n\r\n   end  ",
    "def f(x):\n    return x**2 + 1_000  # 12345 \u0041BC\n\n\n\tfoo.bar(baz)[0] != 'q'\r\n",
    "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n",
    "    \n    \n  x  \n\n\t\t\n   ",
    "a<|im_end|>b<|im_end|><|im_end|>  <tool_call>\n{\"name\": \"bash\"}\n</tool_call>",
)


class _NotCovered(Exception):
    """The split pattern does not cover a text (never expected): the text goes to the tokenizer."""


class _TokenCache(dict):
    """Text -> its tokens (int32 bytes). A text not in it is tokenized by `make` on the lookup itself (`__missing__`),
    so a text's pieces are one `map` of lookups joined in C, with no pass to find the ones that were missing. Texts
    longer than CACHED_CHARS are not kept (see CACHED_CHARS); past CACHED_WORDS entries it starts over."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, text: str) -> bytes:
        data = self.make(text)
        if len(text) <= CACHED_CHARS:
            if len(self) >= CACHED_WORDS:
                self.clear()
            self[text] = data
        return data


class WordCacheEncoder:
    """Tokens of ASCII text, as the tokenizer gives them (see the module docstring). Build it with `for_tokenizer`."""

    def __init__(self, split: re.Pattern, model, added: dict[str, int], bpe=None, byte_chars=None) -> None:
        self._split = split
        self._model = model  # the tokenizer's BPE model behind a byte-level mapping, without the word split
        # the BPE model itself and the byte-level pre-tokenizer's character for each ASCII byte: an unseen word's
        # tokens without the tokenizer's pipeline around the model (None: through `model`)
        self._bpe, self._byte_chars = bpe, byte_chars
        self._added_tokens = {token: array("i", [token_id]).tobytes() for token, token_id in added.items()}
        # leftmost match, the longest at that position (as the tokenizer matches added tokens)
        self._added = (re.compile("|".join(re.escape(token) for token in sorted(added, key=len, reverse=True)))
                       if added else None)
        # Tokens as int32 bytes: joined in C, and never walked by the garbage collector.
        self._cache = _TokenCache(self._word_bytes)  # word -> its tokens
        self._units = _TokenCache(self._unit_bytes)  # unit (held spaces marked) -> its tokens
        self._segments = _TokenCache(self._text_bytes)  # short text between added tokens -> its tokens

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
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        bare = Tokenizer(model)  # the same BPE model, reached without the split, the normalizer or added tokens
        bare.pre_tokenizer = byte_level
        try:
            byte_chars = str.maketrans({chr(code): "".join(piece for piece, _ in byte_level.pre_tokenize_str(chr(code)))
                                        for code in range(128)})
        except Exception:  # a tokenizers version without these: the pipeline's own call for each word
            byte_chars = None
        encoder = cls(ASCII_SPLITS[pattern], bare, added, model, byte_chars)
        words = list(dict.fromkeys(chain.from_iterable(encoder._split.findall(text) for text in CHECK_TEXTS)))
        if encoder._encode_words(words) != [bare.encode(word, add_special_tokens=False).ids for word in words]:
            log.warning("the BPE model alone tokenizes words differently from the tokenizer; using the tokenizer")
            encoder._bpe = None
        for text in CHECK_TEXTS:
            if encoder.encode(text) != tokenizer.encode(text, add_special_tokens=False).ids:
                log.warning("the word-cache tokenizer differs from the tokenizer on a check text; not using it")
                return None
        encoder.clear()
        return encoder

    def clear(self) -> None:
        self._cache.clear()
        self._units.clear()
        self._segments.clear()

    def encode(self, text: str) -> list[int] | None:
        """The token ids of `text`, or None when it is not ASCII (ask the tokenizer)."""
        data = self.encode_bytes(text)
        return None if data is None else array("i", data).tolist()

    def encode_array(self, text: str) -> array | None:
        """`encode` as an int32 array (read from the tokens' bytes in one copy)."""
        data = self.encode_bytes(text)
        return None if data is None else array("i", data)

    def encode_bytes(self, text: str) -> bytes | None:
        """The token ids of `text` as the bytes of an int32 array, or None when it is not ASCII."""
        if not text.isascii():
            return None
        parts: list[bytes | None] = []
        position = 0
        if self._added is not None:
            for match in self._added.finditer(text):
                if match.start() > position:
                    parts.append(self._segment(text[position:match.start()]))
                parts.append(self._added_tokens[match.group()])
                position = match.end()
        if position < len(text):
            parts.append(self._segment(text[position:]))
        if None in parts:  # never expected: the pattern covers every character
            return None
        return b"".join(parts)  # type: ignore[arg-type]

    def _segment(self, segment: str) -> bytes | None:
        """Tokens of a text between added tokens: cut into units (see the module docstring), each kept whole."""
        try:
            if len(segment) <= SHORT_SEGMENT:  # template text between added tokens ("\n", "assistant\n"): kept whole
                return self._segments[segment]
            if HELD_SPACE in segment or NO_SPACE in segment:
                return self._text_bytes(segment)
            # (A one-character `in` costs almost nothing, a two-character one as much as a `replace` that finds
            # nothing: each pair is replaced only where its first character occurs, with no `in` for the pair.)
            marked = segment.replace("  ", " " + HELD_SPACE)  # runs of spaces: every second one held, then the rest
            held = marked is not segment  # (a replace that finds nothing returns its string; a copy only costs a pass)
            for pair in _WHITESPACE_THEN_SPACE:
                if pair[0] in marked:
                    before = marked
                    marked = marked.replace(pair, pair[0] + HELD_SPACE)
                    held = held or marked is not before
            if held:  # after a held one
                marked = marked.replace(HELD_SPACE + " ", HELD_SPACE + HELD_SPACE)
            # every space left follows a character that is not whitespace: a cut
            if "\n" in marked:  # after a newline, before a character that is not whitespace
                lines = marked
                marked = marked.replace("\n", "\n" + _LINE_CUT)
                for char in _NOT_BEFORE:
                    if char in lines:
                        marked = marked.replace(_LINE_CUT + char, char)
            units = marked.split(" ")
            units[0] = NO_SPACE + units[0]
            return b"".join(map(self._units.__getitem__, units))
        except _NotCovered:
            return None

    def _unit_bytes(self, unit: str) -> bytes:
        """A unit's tokens: its text after the space it was cut at, or without one (marked NO_SPACE)."""
        text = unit[1:] if unit[:1] == NO_SPACE else " " + unit
        return self._text_bytes(text.replace(HELD_SPACE, " "))

    def _text_bytes(self, text: str) -> bytes:
        """A text's tokens, from its words' (split by the pattern, each kept). Raises _NotCovered when the pattern
        does not cover the text (never expected)."""
        words = self._split.findall(text)
        if "".join(words) != text:
            raise _NotCovered(text)
        return b"".join(map(self._cache.__getitem__, words))

    def _word_bytes(self, word: str) -> bytes:
        """An unseen word's tokens (a new path, a hash), by the tokenizer's BPE on that word alone: the model's own
        `tokenize` of the word's bytes as the byte-level pre-tokenizer maps them (what the tokenizer does for one
        word, without building an encoding around it)."""
        if self._bpe is not None and self._byte_chars is not None:
            return array("i", map(_TOKEN_ID, self._bpe.tokenize(word.translate(self._byte_chars)))).tobytes()
        return array("i", self._model.encode(word, add_special_tokens=False).ids).tobytes()

    def _encode_words(self, words: list[str]) -> list[list[int]]:
        return [array("i", self._word_bytes(word)).tolist() for word in words]
