"""A scripted engine for tests and demos: fixed response texts, real log-probs and routing.

Each `generate()` call emits the next scripted text exactly (tokenized, ending with `<|im_end|>`); the inner
model scores prompt + response in one forward, so log-probs and routed experts are those of the real policy
(computed as the inner engine computes them: temperature-1 log-probs, routing of every token). When the script
runs out, every further call emits `final_text`. `stream` yields the text's tokens one by one, then the scored
result.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from lego.engine.base import EngineWrapper, GenerateResult, SamplingParams, TokenChunk, stop_string_in

END_OF_TURN = "<|im_end|>"
DEFAULT_FINAL_TEXT = "I am done."


class ScriptedEngine(EngineWrapper):
    constrained_decoding = False  # its texts are fixed: a constrained request is refused, never answered unconstrained

    def __init__(self, inner, tokenizer, script: list[str], final_text: str = DEFAULT_FINAL_TEXT) -> None:
        """`inner`: a scorer with `score_with_routing(ids, first)` (TransformersEngine); `tokenizer`: its tokenizer."""
        super().__init__(inner)
        self.tokenizer = tokenizer
        self.script = list(script)
        self.final_text = final_text
        self.calls = 0
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)

    def next_text(self) -> str:
        text = self.script[self.calls] if self.calls < len(self.script) else self.final_text
        self.calls += 1
        return text

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        response, finish_reason, stop_sequence = self._respond(sampling)
        return await self._scored(prompt_ids, response, finish_reason, stop_sequence)

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        response, finish_reason, stop_sequence = self._respond(sampling)
        for token in response:
            yield TokenChunk([token])
        yield TokenChunk([], await self._scored(prompt_ids, response, finish_reason, stop_sequence))

    def _respond(self, sampling: SamplingParams) -> tuple[list[int], str, str | None]:
        """The next scripted text's tokens, cut as sampling would cut them, with the finish reason and stop string."""
        response = self.tokenizer.encode(self.next_text(), add_special_tokens=False) + [self.end_of_turn_id]
        response = response[: sampling.max_tokens]
        finish_reason, stop_sequence = "length", None
        for index, token in enumerate(response):
            if token in sampling.stop_token_ids:
                response, finish_reason = response[: index + 1], "stop"
                break
            if sampling.stop:
                text = self.tokenizer.decode(response[: index + 1], skip_special_tokens=False)
                matched = stop_string_in(text, sampling.stop)
                if matched is not None:
                    response, finish_reason, stop_sequence = response[: index + 1], "stop", matched
                    break
        return response, finish_reason, stop_sequence

    async def _scored(self, prompt_ids: list[int], response: list[int], finish_reason: str,
                      stop_sequence: str | None) -> GenerateResult:
        logprobs, routed = await self.inner.score_with_routing(list(prompt_ids) + response, first=len(prompt_ids))
        return GenerateResult(token_ids=response, logprobs=logprobs, routed_experts=routed,
                              finish_reason=finish_reason, prompt_tokens=len(prompt_ids),
                              stop_sequence=stop_sequence)
