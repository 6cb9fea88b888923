"""The model's own chat template, rendered incrementally: only new messages are tokenized.

The template is rendered as text (cheap: ~3 ms for a 110 KB conversation) and only the text of the new messages
is tokenized (the expensive part: ~45 ms for the same conversation). The text of the new messages is the full
render minus the render of the known messages, where the known messages are rendered *followed by a boundary
message* so that they take the form they have mid-conversation (Qwen3 renders a last assistant turn with an
empty `<think>` block and closes a tool-response group only before a non-tool turn). Known assistant turns are
rendered without reasoning in both renders: their text is discarded anyway (the session keeps the sampled
tokens) and this keeps Qwen3's think-stripping of earlier turns from moving the boundary.

Tokenizing the new text apart gives the same tokens as tokenizing the whole render because every message
boundary in the template sits next to a special or added token (`<|im_end|>`, `<|im_start|>`,
`<tool_response>`), which the tokenizer never merges across. Tests check this against full rendering.
"""

from __future__ import annotations

from typing import Any

BOUNDARY = "\x00lego-boundary\x00"


class ChatRenderer:
    def __init__(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; the proxy needs the model's own template")
        self.tokenizer = tokenizer
        self._fast = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer, without Python overhead
        probe = [{"role": "user", "content": BOUNDARY}]
        without = self.render(probe, [], add_generation_prompt=False)
        self.generation_prompt = self.render(probe, [], add_generation_prompt=True)[len(without):]
        self.generation_prompt_ids = self.encode(self.generation_prompt)
        self.user_prefix = without[: without.index(BOUNDARY)]  # Qwen3: "<|im_start|>user\n"
        # What the template writes after an assistant turn's content, before the next turn (Qwen3: "<|im_end|>\n").
        turn = self.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": BOUNDARY},
                            {"role": "user", "content": "b"}], [], add_generation_prompt=False)
        after = turn[turn.index(BOUNDARY) + len(BOUNDARY):]
        self.turn_end = after[: after.index(self.user_prefix + "b")]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prefix_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """The text the full template gives `messages` when more messages follow them."""
        if not messages:
            return ""
        text = self.render([*messages, {"role": "user", "content": BOUNDARY}], tools, add_generation_prompt=False)
        return text[: text.rindex(self.user_prefix + BOUNDARY)]

    def bridge_after(self, reply_text: str) -> str:
        """Template text still owed after a sampled reply before the next turn: the part of `turn_end` the
        model did not write itself (after a sampled `<|im_end|>`, Qwen3 owes "\\n"; after a cut-off reply,
        "<|im_end|>\\n")."""
        for size in range(len(self.turn_end), 0, -1):
            if reply_text.endswith(self.turn_end[:size]):
                return self.turn_end[size:]
        return self.turn_end
