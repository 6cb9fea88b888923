"""The vLLM engine (GPU): vLLM's AsyncLLM with routed-experts capture, token ids in and out.

- Prompts go in as `TokensPrompt(prompt_token_ids=...)`: nothing is re-tokenized.
- Log-probs: `logprobs=0` returns the sampled token's log-prob, and `logprobs_mode="raw_logprobs"` makes it the
  log-prob under the unscaled (temperature-1) policy, as TransformersEngine does.
- Routing: `enable_return_routed_experts=True` makes vLLM return `CompletionOutput.routed_experts`
  `[tokens fed, layers, top_k]` for the prompt and the generated tokens. vLLM never feeds the last sampled token,
  so its row is missing; it is filled with zeros here. That row is harmless for training: a token's routing only
  shapes its own position's output, which predicts the *next* token, and there is none (in a later turn the
  token is part of the prompt, and its real routing comes with that call).
- Streaming: AsyncLLM yields the request's output as it grows (cumulative token ids); `stream` passes on the new
  tokens of each output and ends with the result built from the last one, exactly what `generate` returns.
- Stop strings: vLLM detokenizes only for requests that have them and ends on the token that completes one,
  keeping that token (`include_stop_str_in_output`); the matched string comes back as `stop_reason`.
- `load_checkpoint` restarts the engine on the new weights (simple and exact; a weight-sync path belongs to
  verl's trainer on GPU, see lego/train/verl_agent_loop.py).

Importing this module never needs vLLM; constructing `VLLMEngine` without it raises `EngineUnavailableError`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from lego.engine.base import GenerateResult, SamplingParams, TokenChunk
from lego.engine.checkpoint import policy_version as read_policy_version
from lego.errors import LegoError


class EngineUnavailableError(LegoError):
    """The chosen engine cannot run here (missing package or hardware)."""


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine:
    def __init__(self, model_path: str | Path, dtype: str = "bfloat16", max_context: int | None = None,
                 gpu_memory_utilization: float = 0.85, policy_version: int | None = None, **engine_kwargs) -> None:
        if not vllm_available():
            raise EngineUnavailableError(
                "engine.kind=vllm needs vLLM on a CUDA machine: install the GPU extra "
                "(pip install 'lego[gpu]') or set engine.kind=transformers"
            )
        self.model_path = Path(model_path)
        self.dtype = dtype
        self.gpu_memory_utilization = gpu_memory_utilization
        self.engine_kwargs = engine_kwargs
        self._max_context = max_context
        self.policy_version = read_policy_version(self.model_path) if policy_version is None else policy_version
        self._start()

    def _start(self) -> None:
        from transformers import AutoConfig
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        config = AutoConfig.from_pretrained(str(self.model_path))
        self.max_context = int(self._max_context or getattr(config, "max_position_embeddings", 32768))
        eos = config.eos_token_id
        self.eos_token_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        args = AsyncEngineArgs(
            model=str(self.model_path), dtype=self.dtype, max_model_len=self.max_context,
            gpu_memory_utilization=self.gpu_memory_utilization, enable_return_routed_experts=True,
            logprobs_mode="raw_logprobs", skip_tokenizer_init=False, **self.engine_kwargs,
        )
        self.engine = AsyncLLM.from_engine_args(args)

    def _sampling_params(self, sampling: SamplingParams):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
            stop_token_ids=list(sampling.stop_token_ids), seed=sampling.seed, logprobs=0,
            ignore_eos=True,  # only the caller's stop ids end a generation, as in TransformersEngine
            stop=list(sampling.stop) or None, include_stop_str_in_output=True, skip_special_tokens=False,
            detokenize=bool(sampling.stop),  # stop strings are matched on text; nothing else needs it
        )

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        result = None
        async for chunk in self.stream(prompt_ids, sampling):
            result = chunk.result
        if result is None:
            raise LegoError("vLLM's stream ended without a result; check the vLLM server log")
        return result

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        from vllm import TokensPrompt

        final, sent = None, 0
        async for output in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                                 self._sampling_params(sampling), request_id=uuid.uuid4().hex):
            final = output
            tokens = output.outputs[0].token_ids if output.outputs else ()
            if len(tokens) > sent:
                yield TokenChunk(list(tokens[sent:]))
                sent = len(tokens)
        if final is None or not final.outputs:
            raise LegoError("vLLM returned no output for a request; check the vLLM server log")
        result = self._result(final.outputs[0], prompt_ids, sampling)
        yield TokenChunk(result.token_ids[sent:], result)

    @staticmethod
    def _result(completion, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        """The GenerateResult of a finished request's CompletionOutput."""
        token_ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise LegoError("vLLM returned no log-prob for some sampled tokens; is logprobs=0 supported here?")
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids, strict=True)]
        routed = completion.routed_experts
        if routed is not None:
            routed = np.asarray(routed)
            rows = len(prompt_ids) + len(token_ids)
            if routed.shape[0] > rows:
                raise LegoError(f"vLLM returned routing for {routed.shape[0]} tokens, more than the {rows} it saw")
            padded = np.zeros((rows, *routed.shape[1:]), dtype=np.uint8)
            padded[: routed.shape[0]] = routed
            routed = padded
        stop_sequence = completion.stop_reason if isinstance(completion.stop_reason, str) else None
        stopped = (bool(token_ids) and token_ids[-1] in sampling.stop_token_ids) or stop_sequence is not None
        return GenerateResult(token_ids=token_ids, logprobs=logprobs, routed_experts=routed,
                              finish_reason="stop" if stopped else "length", prompt_tokens=len(prompt_ids),
                              stop_sequence=stop_sequence)

    async def score(self, token_ids: list[int]) -> list[float]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm import TokensPrompt

        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        final = None
        async for output in self.engine.generate(TokensPrompt(prompt_token_ids=list(token_ids)), params,
                                                 request_id=uuid.uuid4().hex):
            final = output
        values = [0.0]
        for position, entry in enumerate((final.prompt_logprobs or [])[1:], start=1):
            values.append(float(entry[token_ids[position]].logprob) if entry else 0.0)
        return values

    def load_checkpoint(self, path: str | Path, policy_version: int) -> None:
        self.engine.shutdown()
        self.model_path = Path(path)
        self._start()
        self.policy_version = policy_version
