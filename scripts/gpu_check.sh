#!/usr/bin/env bash
# The trainer's steps and `lego bench r3` on the device, with a random-init Qwen3-MoE sized to it, as one script.
#
#   scripts/gpu_check.sh [--cpu] [OUT_DIR]
#
# On CUDA (torch.cuda.is_available()): a large Qwen3-MoE (many experts, many layers), bf16 inference against fp32
# training, where routing drifts for real between the two; on the CPU (or with --cpu): the embedded tiny model, the
# size CI runs. It writes OUT_DIR/gpu_check.json (default: $OUT when set, else .lego-gpu/out) with the Pearson of
# train against inference log-probs with and without R3, the share of tokens routed differently, and the seconds
# per optimizer step with and without R3.
#
# The GPU machine has torch and transformers and fetches nothing: the repository's Python dependencies must
# import there (the script names any that do not), and the Qwen3 tokenizer must travel with the repository:
#   mkdir -p .lego-gpu/cache && cp -r ~/.cache/lego/tokenizers .lego-gpu/cache/   # then carry .lego-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

FORCE_CPU=0
if [ "${1:-}" = "--cpu" ]; then FORCE_CPU=1; shift; fi
OUT_DIR="${1:-${OUT:-$ROOT/.lego-gpu/out}}"
mkdir -p "$OUT_DIR"

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
if [ -z "${LEGO_CACHE_DIR:-}" ] && [ -d "$ROOT/.lego-gpu/cache/tokenizers" ]; then
  export LEGO_CACHE_DIR="$ROOT/.lego-gpu/cache"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

missing="$("$PYTHON" - <<'EOF'
import importlib.util
needed = ["torch", "transformers", "numpy", "pydantic", "yaml", "typer", "rich", "safetensors", "tokenizers"]
print(" ".join(name for name in needed if importlib.util.find_spec(name) is None))
EOF
)"
if [ -n "$missing" ]; then
  echo "gpu_check: $PYTHON cannot import: $missing. Install them (pip install -e .) or set PYTHON to an interpreter that has them." >&2
  exit 3
fi

DEVICE=cpu
if [ "$FORCE_CPU" = 0 ] && "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  DEVICE=cuda
fi

WORK="$OUT_DIR/work"
COMMON=(project.work_dir="$WORK" engine.device="$DEVICE" engine.dtype=bfloat16 train.dtype=float32)
if [ "$DEVICE" = cuda ]; then
  # About 0.9 B parameters in 12 layers of 64 experts (top 8): fp32 weights, gradients and Adam's two moments take
  # ~15 GB, far inside one large GPU; many experts and layers are what make bf16-vs-fp32 routing drift measurable.
  SIZE=(model.name=gpu-check-qwen3-moe model.init.hidden_size=1024 model.init.num_hidden_layers=12
        model.init.num_attention_heads=16 model.init.num_key_value_heads=4 model.init.head_dim=64
        model.init.num_experts=64 model.init.num_experts_per_tok=8 model.init.moe_intermediate_size=384
        engine.max_batch_size=16)
  R3_ARGS=(trajectories=32 max_tokens=256)
  TRAIN_ARGS=(trajectories=16 max_tokens=256 steps=3)
else
  SIZE=(model.name=gpu-check-tiny)
  R3_ARGS=(trajectories=4 max_tokens=32)
  TRAIN_ARGS=(trajectories=4 max_tokens=32 steps=2)
fi

echo "gpu_check: device $DEVICE, python $PYTHON, results in $OUT_DIR" >&2
"$PYTHON" - "$OUT_DIR/gpu_check.json" "$DEVICE" "${COMMON[@]}" "${SIZE[@]}" -- "${R3_ARGS[@]}" -- "${TRAIN_ARGS[@]}" <<'EOF'
import json, platform, sys, time

out, device, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
overrides = rest[:rest.index("--")]
rest = rest[rest.index("--") + 1:]
r3_args = dict(arg.split("=") for arg in rest[:rest.index("--")])
train_args = dict(arg.split("=") for arg in rest[rest.index("--") + 1:])

import torch
from lego.bench.r3 import bench_r3
from lego.bench.train import bench_train
from lego.config import load_config
from lego.workdir import WorkDir

config = load_config("default", overrides)
work = WorkDir.create(config.project.work_dir)
started = time.perf_counter()
r3 = bench_r3(config, work, **{k: int(v) for k, v in r3_args.items()})
train = bench_train(config, work, **{k: int(v) for k, v in train_args.items()})
result = {
    "device": device,
    "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
    "torch": torch.__version__,
    "model": {key: getattr(config.model.init, key) for key in ("hidden_size", "num_hidden_layers", "num_experts",
                                                               "num_experts_per_tok", "moe_intermediate_size")},
    "inference_dtype": config.engine.dtype,
    "training_dtype": config.train.dtype,
    "bench_r3": r3,
    "trainer_steps": train,
    "summary": {
        "pearson_with_r3": r3["with_r3"]["pearson"],
        "pearson_without_r3": r3["without_r3"]["pearson"],
        "routing_differs_share": r3["routing_differs_share"],
        "step_seconds_with_r3": train["with_r3"]["steady_step_seconds"],
        "step_seconds_without_r3": train["without_r3"]["steady_step_seconds"],
    },
    "seconds": round(time.perf_counter() - started, 1),
}
with open(out, "w") as handle:
    json.dump(result, handle, indent=2)
print(json.dumps(result["summary"], indent=2))
EOF
