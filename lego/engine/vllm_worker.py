"""vLLM's side of the vLLM engine: a process in vLLM's own environment serving token ids over a Unix socket.

Started by lego.engine.vllm_engine as `python -m lego.engine.vllm_worker --socket PATH --model DIR ...` with the
repository on PYTHONPATH; it imports only the standard library and vLLM (never the rest of Lego, whose
dependencies that environment lacks). It connects to the socket its parent listens on and speaks JSON lines:

  parent -> worker  {"op": "generate", "id", "prompt_ids", "sampling": {...}} | {"op": "score", "id", "token_ids"}
                    (sampling's "structural_tag": an xgrammar structural tag the sampled tokens must follow)
                    {"op": "load_weights", "id", "path"} | {"op": "abort", "id"} | {"op": "shutdown"}
  worker -> parent  {"op": "ready"}                                      once the model is loaded
                    {"id", "token_ids", "logprobs"}                      tokens sampled since the last message
                    {"id", "done": true, "finish_reason", "stop_reason"}  a generation's end (with
                                                                          "routed_experts" where vLLM reports them)
                    {"id", "done": true, "logprobs"}                      a score's answer
                    {"id", "done": true, "seconds"}                       the new weights are in place
                    {"id", "error"}                                       a request that failed
                    {"id", "error", "grammar_error"}                      a structural tag xgrammar refused

One process: vLLM's `LLMEngine` runs in-process (no engine-core or executor processes, each of which would import
vLLM again: a minute on a busy 2-core machine), and this loop steps it while it has requests, reading the socket
between steps. Token ids go in as `TokensPrompt` and come back as ids: nothing is re-tokenized. Each sampled
token's log-prob is vLLM's `raw_logprobs` (log softmax of the unscaled, temperature-1 logits), as the transformers
engine reports. JSON carries floats at full precision (repr round-trips), so log-probs arrive bit for bit.

`load_weights` swaps a checkpoint of the same architecture into the running model between two engine steps
(`reload_weights`), instead of a restart that imports vLLM again; see `reload_weights` below.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import sys
import time
from pathlib import Path

CPU_KV_CACHE_BYTES = 1 << 30
# The config keys that fix the model's parameter shapes: a checkpoint that differs in one cannot be loaded in place.
SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "moe_intermediate_size",
              "shared_expert_intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "vocab_size",
              "tie_word_embeddings", "decoder_sparse_step", "mlp_only_layers", "attention_bias")


class ArchitectureMismatchError(ValueError):
    """A checkpoint whose shapes differ from the running model's: only a restart can load it."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_cpu_head_dim(model: str) -> None:
    """vLLM's CPU attention kernels exist for some head sizes only; a model with another one loads and then fails
    its first request, so it is refused here with what to do."""
    config = json.loads((Path(model) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(f"vLLM's CPU attention has no kernel for head_dim={head_dim} (it has {supported}); "
                         "use a model whose head_dim is one of them (model.init.head_dim) or engine.kind=transformers")


def moe_shape(model: str) -> tuple[int, int] | None:
    """(layers, experts per token) of a MoE checkpoint, None for a dense one."""
    config = json.loads((Path(model) / "config.json").read_text())
    top_k = config.get("num_experts_per_tok")
    return (int(config["num_hidden_layers"]), int(top_k)) if top_k else None


def make_engine(options: argparse.Namespace):
    from vllm import EngineArgs, LLMEngine

    extra = json.loads(options.engine_args or "{}")
    if cuda_available():  # vLLM's own routing capture needs its GPU model runner
        extra.setdefault("enable_return_routed_experts", True)
    else:  # a fixed KV cache: by default vLLM reserves most of the machine's memory on CPU and refuses to start
        check_cpu_head_dim(options.model)
        extra.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
        # Every prompt prefilled in one step: a seeded request prefilled in chunks crashes vLLM's CPU model runner
        # (it rewinds the request's generator, which CPU generators cannot do). A step's budget holds the longest
        # prompt, and without chunked prefill a prompt that does not fit what is left of a step waits for the next.
        extra.setdefault("max_num_batched_tokens", max(options.max_model_len, 2048))
        extra.setdefault("enable_chunked_prefill", False)
        if moe_shape(options.model) is not None:  # lego.engine.vllm_routing needs every token computed, eagerly
            extra.setdefault("enable_prefix_caching", False)
            extra.setdefault("enforce_eager", True)
    extra.setdefault("distributed_executor_backend", "uni")  # the model in this process
    args = EngineArgs(model=options.model, dtype=options.dtype, max_model_len=options.max_model_len,
                      logprobs_mode="raw_logprobs", seed=0, **extra)
    return LLMEngine.from_engine_args(args, enable_multiprocessing=False)


class GrammarError(ValueError):
    """A request's structural tag that xgrammar cannot compile (the parent's ConstraintError)."""


class StructuralTags:
    """The grammar check for requests with a constraint, in place of vLLM's.

    vLLM checks a structural tag with no tokenizer at hand (`validate_xgrammar_grammar`), so it refuses every tag
    with a `token` format, which only the vocabulary resolves: the `<tool_call>` that opens a call, the empty think
    block. Its compiler has the vocabulary and takes them. So each tag is compiled here with the vocabulary, as the
    transformers engine compiles it (which also gives xgrammar's own reason for a tag it refuses), and vLLM's check
    passes tags on. xgrammar's compile cache is off in both compilers: in 0.2.8 it hands a tag the token masks of
    another that differs only in the ids of its `token` formats (lego/engine/grammar_mask.py).

    Made before the engine, so that vLLM's compiler, built at its first constrained request, is built uncached."""

    KEEP = 64  # checked tags remembered (a harness sends the same few tool sets again and again)

    def __init__(self) -> None:
        import xgrammar as xgr
        from vllm.v1.structured_output import backend_xgrammar

        self.compiler = None  # made at the first constrained request: it reads the whole vocabulary
        self.checked: dict[str, None] = {}
        vllm_check = backend_xgrammar.validate_xgrammar_grammar

        def validate(sampling_params) -> None:
            if not sampling_params.structured_outputs.structural_tag:
                vllm_check(sampling_params)  # anything else as vLLM checks it

        backend_xgrammar.validate_xgrammar_grammar = validate  # vLLM imports it from the module at each check
        original = xgr.GrammarCompiler.__init__

        def uncached(compiler, tokenizer_info, **options):
            original(compiler, tokenizer_info, **{**options, "cache_enabled": False})

        xgr.GrammarCompiler.__init__ = uncached

    def structured_outputs(self, engine, structural_tag: str | None):
        """vLLM's structured outputs for a request's structural tag, once it compiles (GrammarError if not)."""
        if structural_tag is None:
            return None
        import xgrammar as xgr
        from vllm.sampling_params import StructuredOutputsParams

        if structural_tag not in self.checked:
            if self.compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(engine.get_tokenizer(),
                                                          vocab_size=engine.model_config.get_vocab_size())
                self.compiler = xgr.GrammarCompiler(info, max_threads=1)
            try:
                self.compiler.compile_structural_tag(structural_tag)
            except Exception as exc:
                raise GrammarError(str(exc) or type(exc).__name__) from exc
            self.checked[structural_tag] = None
            if len(self.checked) > self.KEEP:
                self.checked.pop(next(iter(self.checked)))
        return StructuredOutputsParams(structural_tag=structural_tag)


def sampling_params(sampling: dict, structured_outputs=None):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    stop = list(sampling.get("stop") or ())
    return SamplingParams(
        # The grammar's mask is applied to the logits before the sampler, so `raw_logprobs` are the masked
        # distribution's, as the transformers engine reports; once the grammar is complete only the stop ids are
        # allowed (vLLM's matcher takes the request's stop ids).
        structured_outputs=structured_outputs,
        temperature=sampling["temperature"], top_p=sampling["top_p"], max_tokens=sampling["max_tokens"],
        stop_token_ids=list(sampling.get("stop_token_ids") or ()), seed=sampling.get("seed"), logprobs=0,
        ignore_eos=True,  # only the caller's stop ids end a generation, as in the transformers engine
        stop=stop or None, include_stop_str_in_output=True, skip_special_tokens=False,
        detokenize=bool(stop),  # stop strings are matched on text; nothing else needs it
        output_kind=RequestOutputKind.DELTA,
    )


def check_same_architecture(current: str, new: str) -> None:
    """Refuse, before touching a weight, a checkpoint the running model cannot take: a reload that failed halfway
    would leave a model of mixed weights serving."""
    old, fresh = (json.loads((Path(path) / "config.json").read_text()) for path in (current, new))
    changed = {key: (old.get(key), fresh.get(key)) for key in SHAPE_KEYS if old.get(key) != fresh.get(key)}
    if changed:
        raise ArchitectureMismatchError(f"{new} is not the running model's architecture (config {changed}, as "
                                        "(running, new)); restart the engine on it")


def reload_weights(engine, path: str) -> None:
    """Load the checkpoint at `path` into `engine`'s model in place.

    vLLM's layerwise `reload_weights` loads each layer in checkpoint format and reruns its post-load processing,
    which on CPU packs each layer's weights for its kernels. Two layers miss it, and are repacked here: the fused-MoE
    experts (a weight update skips their CPU prepack, as if the kernel's layout were in place: they would run on
    unpacked weights), and a layer that shares its weight with another (the LM head tied to the embeddings is never
    loaded itself: its GEMM would keep a packed copy of the old weight). Cached KV was computed by the old weights,
    so the prefix cache is emptied."""
    cpu = not cuda_available()

    def reload(worker) -> None:
        worker.reload_weights(weights_path=path, is_checkpoint_format=True)
        if cpu:
            repack_cpu_layers(worker.model_runner.model)

    engine.collective_rpc(reload)
    engine.reset_prefix_cache()


def repack_cpu_layers(model) -> None:
    """Rerun the CPU packing `reload_weights` leaves out (see there)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None:
            kernel.fused_experts.process_weights_after_loading(module)
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # a GEMM that still holds its weight


class Worker:
    def __init__(self, engine, connection: socket.socket, routing=None, model: str = "",
                 tags: StructuralTags | None = None) -> None:
        self.engine = engine
        self.tags = tags or StructuralTags()
        self.model = model  # the checkpoint the model's weights come from
        self.connection = connection
        self.routing = routing  # a lego.engine.vllm_routing.RoutingCapture, where vLLM does not report routing
        self.buffer = b""
        self.kinds: dict[str, str] = {}  # request id -> "generate" | "score", while vLLM holds it
        self.scored: dict[str, list[int]] = {}  # a score request's token ids
        self.fed: dict[str, int] = {}  # request id -> tokens fed to the model so far (prompt, then sampled)
        self.internal: dict[str, str] = {}  # request id -> vLLM's own id for it (its model runner's)

    def send(self, message: dict) -> None:
        self.connection.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def serve(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            readable, _, _ = select.select([self.connection], [], [], 0 if busy else None)
            if readable:
                data = self.connection.recv(1 << 20)
                if not data:
                    return  # the parent is gone
                self.buffer += data
                *lines, self.buffer = self.buffer.split(b"\n")
                for line in lines:
                    if line and not self.handle(json.loads(line)):
                        return
            if self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    self.answer(output)

    def handle(self, message: dict) -> bool:
        """Take one message from the parent; False when it says to stop."""
        op, request_id = message["op"], message.get("id")
        if op == "shutdown":
            return False
        if op == "abort":
            if self.kinds.pop(request_id, None) is not None:
                self.forget(request_id)
                self.engine.abort_request([request_id])
            return True
        if op == "load_weights":
            self.load_weights(request_id, message["path"])
            return True
        try:
            self.add(op, request_id, message)
        except Exception as exc:  # a request vLLM refuses fails alone; the worker serves on
            self.kinds.pop(request_id, None)
            self.forget(request_id)
            refused = {"grammar_error": str(exc)} if isinstance(exc, GrammarError) else {}
            self.send({"id": request_id, "error": f"{type(exc).__name__}: {exc}", **refused})
        return True

    def load_weights(self, request_id: str, path: str) -> None:
        """Swap the weights at `path` in between two steps; requests running go on with the new weights."""
        started = time.perf_counter()
        try:
            check_same_architecture(self.model, path)
            reload_weights(self.engine, path)
        except Exception as exc:  # the parent restarts the worker on the checkpoint instead
            self.send({"id": request_id, "error": f"{type(exc).__name__}: {exc}"})
            return
        self.model = path
        self.send({"id": request_id, "done": True, "seconds": time.perf_counter() - started})

    def add(self, op: str, request_id: str, message: dict) -> None:
        from vllm import SamplingParams, TokensPrompt

        if op == "generate":
            structured = self.tags.structured_outputs(self.engine, message["sampling"].get("structural_tag"))
            prompt, params = message["prompt_ids"], sampling_params(message["sampling"], structured)
        elif op == "score":
            prompt = message["token_ids"]
            params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
            self.scored[request_id] = prompt
        else:
            raise ValueError(f"unknown op {op!r}")
        self.kinds[request_id] = op
        self.fed[request_id] = len(prompt)
        self.internal[request_id] = self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)

    def forget(self, request_id: str) -> None:
        self.scored.pop(request_id, None)
        self.fed.pop(request_id, None)
        internal = self.internal.pop(request_id, None)
        if self.routing is not None and internal is not None:
            self.routing.forget(internal)

    def routed_experts(self, request_id: str, fed: int) -> dict:
        """The routing of the `fed` tokens vLLM computed for a finished request, base64 with its shape."""
        internal = self.internal.get(request_id)
        if self.routing is None or internal is None:
            return {}
        routed = self.routing.take(internal, fed)
        return {"routed_experts": base64.b64encode(routed.tobytes()).decode(), "routed_experts_shape": routed.shape}

    def answer(self, output) -> None:
        request_id = output.request_id
        kind = self.kinds.get(request_id)
        if kind is None:
            return  # aborted
        try:
            self.answer_request(kind, request_id, output)
        except Exception as exc:  # e.g. the routing capture's RoutingCaptureError: this request fails loudly
            self.kinds.pop(request_id, None)
            self.forget(request_id)
            if not output.finished:
                self.engine.abort_request([request_id])
            self.send({"id": request_id, "error": f"{type(exc).__name__}: {exc}"})

    def answer_request(self, kind: str, request_id: str, output) -> None:
        if kind == "score":
            if output.finished:
                answer = self.score_answer(request_id, output)
                answer.update(self.routed_experts(request_id, self.fed[request_id]))
                self.kinds.pop(request_id)
                self.forget(request_id)
                self.send(answer)
            return
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        if tokens:
            steps = completion.logprobs or []
            if len(steps) != len(tokens):
                raise RuntimeError(f"vLLM returned {len(steps)} log-probs for {len(tokens)} sampled tokens")
            logprobs = [step[token].logprob for step, token in zip(steps, tokens, strict=True)]
            self.send({"id": request_id, "token_ids": tokens, "logprobs": logprobs})
            self.fed[request_id] += len(tokens)
        if output.finished:
            # vLLM never feeds the last sampled token: its routing is unknown
            done = self.done(request_id, completion, self.fed[request_id] - 1)
            self.kinds.pop(request_id)
            self.forget(request_id)
            self.send(done)

    def done(self, request_id: str, completion, fed: int) -> dict:
        stop_reason = completion.stop_reason if isinstance(completion.stop_reason, str) else None
        done = {"id": request_id, "done": True, "finish_reason": completion.finish_reason, "stop_reason": stop_reason,
                **self.routed_experts(request_id, fed)}
        routed = getattr(completion, "routed_experts", None)
        if routed is not None:  # [tokens fed, layers, top_k]
            import numpy as np

            routed = np.ascontiguousarray(np.asarray(routed, dtype=np.uint8))
            done.update(routed_experts=base64.b64encode(routed.tobytes()).decode(), routed_experts_shape=routed.shape)
        return done

    def score_answer(self, request_id: str, output) -> dict:
        token_ids = self.scored.pop(request_id)
        values = [0.0]  # nothing predicts the first token
        for position, entry in enumerate((output.prompt_logprobs or [])[1:], start=1):
            values.append(entry[token_ids[position]].logprob if entry else 0.0)
        return {"id": request_id, "done": True, "logprobs": values}


def main(options: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tags = StructuralTags()
    engine = make_engine(options)
    routing = None
    shape = moe_shape(options.model)
    if shape is not None and not cuda_available():
        from lego.engine.vllm_routing import install

        routing = install(engine, *shape)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(options.socket)
    worker = Worker(engine, connection, routing, options.model, tags)
    worker.send({"op": "ready"})
    try:
        worker.serve()
    finally:
        connection.close()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--engine-args", default="{}", help="more EngineArgs, as a JSON object")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
