"""Cost-scaled targets: the trained target made costlier without changing what it predicts.

Two shapes, which stress different things:
- narrow (`build_cost_scaled_target`): many added layers of the trained width, each a copy of a
  trained layer with its output projections zeroed. Many small ops: per-op overhead dominates.
- wide (`build_wide_target`): the trained layers with their MLPs widened to
  `intermediate_size` (float32, weights well past the last-level cache). The added gate/up rows
  are copies of trained rows and the added down_proj columns are zero, so every added unit
  contributes exactly 0. A decode step is bound by reading the weights, as a large model's is
  on a GPU; verifying k + 1 tokens should cost about one step.

Narrow, in detail:

Each added layer is a copy of a trained layer with `o_proj` and `down_proj` set to zero, so it
adds exactly 0 to the residual stream (x + 0 == x bit for bit, in any dtype): predictions are
the trained target's, token for token, while every forward pass still does the added layers'
attention and MLP work (no runtime skips zero weights). Hidden size, heads and vocabulary are
unchanged, so the draft/target pair stays compatible; only depth grows.

Why depth and not width: widening intermediate_size or hidden_size would change the trained
tensors' shapes; new layers leave every trained tensor untouched. The number of layers is
chosen from a FLOP estimate per decoded token (matmuls + attention at a typical context), so the
choice does not depend on the machine; `measure_step_seconds` reports the measured ratio.

    python packaging/demo_models/cost_scale.py --dst /tmp/target-x30 --cost-ratio 30 --measure
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

DEFAULT_SRC = Path(__file__).resolve().parents[1] / "demo-models" / "target"
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def layer_matmul_params(cfg: dict) -> int:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = h * cfg["num_attention_heads"] * hd
    kv = 2 * h * cfg["num_key_value_heads"] * hd
    return 2 * q + kv + 3 * h * inter  # q, o, k, v, gate, up, down


def decode_flops(cfg: dict, context: int = 256) -> float:
    """FLOPs to decode one token at `context` cached positions (batch 1)."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    attn = 4 * context * cfg["num_attention_heads"] * hd
    per_layer = 2 * layer_matmul_params(cfg) + attn
    return cfg["num_hidden_layers"] * per_layer + 2 * cfg["vocab_size"] * cfg["hidden_size"]


def extra_layers_for_ratio(target_cfg: dict, draft_cfg: dict, cost_ratio: float) -> int:
    """Smallest number of added layers whose FLOP estimate reaches cost_ratio x the draft's."""
    goal = cost_ratio * decode_flops(draft_cfg)
    base = decode_flops(target_cfg)
    one = decode_flops({**target_cfg, "num_hidden_layers": 1}) - decode_flops(
        {**target_cfg, "num_hidden_layers": 0}
    )
    return max(0, math.ceil((goal - base) / one))


def _read_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def _scaled_tensors(tensors: dict[str, torch.Tensor], layers: int, extra: int) -> dict:
    out = dict(tensors)
    for i in range(layers, layers + extra):
        src = i % layers
        prefix = f"model.layers.{src}."
        for name, t in tensors.items():
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                copy = torch.zeros_like(t) if rest in ZEROED else t.clone()
                out[f"model.layers.{i}.{rest}"] = copy.contiguous()
    return out


def build_cost_scaled_target(
    src_dir: Path | str,
    dst_dir: Path | str,
    extra_layers: int | None = None,
    cost_ratio: float = 30.0,
    draft_dir: Path | str | None = None,
) -> Path:
    """Write a HF dir = src target + zero-output layers; returns dst_dir.

    With extra_layers None the count comes from cost_ratio against the draft
    (default: the `draft` directory next to src_dir).
    """
    src, dst = Path(src_dir), Path(dst_dir)
    cfg = _read_config(src)
    layers = cfg["num_hidden_layers"]
    if extra_layers is None:
        draft_cfg = _read_config(Path(draft_dir) if draft_dir else src.parent / "draft")
        extra_layers = extra_layers_for_ratio(cfg, draft_cfg, cost_ratio)
    tensors = load_file(src / "model.safetensors")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(
        _scaled_tensors(tensors, layers, extra_layers),
        dst / "model.safetensors",
        metadata={"format": "pt"},
    )
    cfg["num_hidden_layers"] = layers + extra_layers
    cfg["specctl_cost_scale"] = {"trained_layers": layers, "zero_output_layers": extra_layers}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in COPIED_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    return dst


WIDE_INTERMEDIATE = 16384


def _widened_tensors(tensors: dict[str, torch.Tensor], layers: int, width: int) -> dict:
    out = dict(tensors)
    for i in range(layers):
        prefix = f"model.layers.{i}.mlp."
        for part in ("gate_proj", "up_proj"):
            w = tensors[prefix + part + ".weight"]  # [I, hidden]
            reps = -(-width // w.shape[0])
            out[prefix + part + ".weight"] = w.repeat(reps, 1)[:width].contiguous()
        down = tensors[prefix + "down_proj.weight"]  # [hidden, I]
        wide = down.new_zeros((down.shape[0], width))
        wide[:, : down.shape[1]] = down
        out[prefix + "down_proj.weight"] = wide
    return out


def build_wide_target(
    src_dir: Path | str, dst_dir: Path | str, intermediate_size: int = WIDE_INTERMEDIATE
) -> Path:
    """Write a HF dir = src target with every MLP widened to `intermediate_size` (the added
    units' down_proj columns zero: same predictions), stored float32; returns dst_dir."""
    src, dst = Path(src_dir), Path(dst_dir)
    cfg = _read_config(src)
    trained = cfg["intermediate_size"]
    if intermediate_size < trained:
        raise ValueError(
            f"intermediate_size {intermediate_size} is below the trained width {trained}"
        )
    tensors = {k: v.float() for k, v in load_file(src / "model.safetensors").items()}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(
        _widened_tensors(tensors, cfg["num_hidden_layers"], intermediate_size),
        dst / "model.safetensors",
        metadata={"format": "pt"},
    )
    cfg["intermediate_size"] = intermediate_size
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    cfg["specctl_cost_scale"] = {"shape": "wide", "trained_intermediate_size": trained}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in COPIED_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    return dst


@torch.no_grad()
def measure_step_seconds(model_dir: Path | str, context: int = 128, steps: int = 32) -> float:
    """Best-of-`steps` seconds of a batch-1 single-token forward with a KV cache (fp32, CPU)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(3, 3 + context)[None] % model.config.vocab_size
    out = model(input_ids=ids, use_cache=True)
    past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=past, use_cache=True)
        times.append(time.perf_counter() - t0)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return min(times)  # min: the machine is shared, noise only adds time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Build the cost-scaled demo target.")
    p.add_argument("--src", type=Path, default=DEFAULT_SRC)
    p.add_argument("--dst", type=Path, required=True)
    p.add_argument("--extra-layers", type=int, default=None)
    p.add_argument("--cost-ratio", type=float, default=30.0)
    p.add_argument("--wide", type=int, default=None, help="build the wide shape of this width")
    p.add_argument("--measure", action="store_true", help="time draft vs scaled target")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.wide:
        dst = build_wide_target(args.src, args.dst, args.wide)
    else:
        dst = build_cost_scaled_target(args.src, args.dst, args.extra_layers, args.cost_ratio)
    cfg, draft_cfg = _read_config(dst), _read_config(args.src.parent / "draft")
    flop_ratio = decode_flops(cfg) / decode_flops(draft_cfg)
    print(f"{dst}: {cfg['num_hidden_layers']} layers, FLOP ratio vs draft {flop_ratio:.1f}")
    if args.measure:
        times = {d: measure_step_seconds(d) for d in (args.src.parent / "draft", args.src, dst)}
        base = times[args.src.parent / "draft"]
        for d, t in times.items():
            print(f"{d}: {t * 1e3:.2f} ms/token ({t / base:.1f}x draft)")


if __name__ == "__main__":
    main()
