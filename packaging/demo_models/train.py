"""Train the demo pair: byte-level BPE, Llama target, Llama draft distilled from the target.

    python packaging/demo_models/train.py --out packaging/demo-models   # full (45 min, 1 thread)
    python packaging/demo_models/train.py --out /tmp/demo --quick        # smoke (<30 s)

Deterministic: fixed file order, fixed held-out split, seeded init and seeded batch order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bpe_tokenizer
import hf_compat
import llama_configs
import stdlib_corpus
from distill import greedy_agreement, make_distill_loss
from lm_train import TrainSpec, evaluate, train_lm
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("packaging/demo-models"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--target-steps", type=int, default=1500)
    p.add_argument("--draft-steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--target-lr", type=float, default=3e-3)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--kl-weight", type=float, default=0.8)
    p.add_argument("--target-dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--draft-dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-files", type=int, default=None, help="use only the first N files")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (a few steps)")
    args = p.parse_args(argv)
    if args.quick:
        args.vocab, args.target_steps, args.draft_steps = 384, 3, 3
        args.batch, args.seq_len, args.max_files = 2, 64, args.max_files or 12
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cached_stream(tok: PreTrainedTokenizerFast, texts: list[str], name: str) -> np.ndarray:
    """Tokenize once; cache keyed by tokenizer and corpus content (outside the repo)."""
    h = hashlib.sha256(tok.backend_tokenizer.to_str().encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    cache = Path(tempfile.gettempdir()) / "specctl-demo-models-cache"
    path = cache / f"{name}-{h.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    stream = bpe_tokenizer.encode_documents(tok, texts)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, stream)
    return stream


def save_model(model: torch.nn.Module, tok: PreTrainedTokenizerFast, out: Path, dtype: str) -> None:
    model.to(DTYPES[dtype])
    model.config.use_cache = True
    model.save_pretrained(out)
    bpe_tokenizer.save_tokenizer(tok, out)
    hf_compat.patch_config(out)
    hf_compat.patch_tokenizer_config(out)
    model.to(torch.float32)


def reload_fp32(path: Path) -> torch.nn.Module:
    """The model exactly as stored (e.g. bf16-rounded), computing in fp32."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def train_target(
    args: argparse.Namespace,
    tok: PreTrainedTokenizerFast,
    train: np.ndarray,
    held: np.ndarray,
    report: dict,
) -> torch.nn.Module:
    spec = llama_configs.QUICK_TARGET if args.quick else llama_configs.TARGET
    model = llama_configs.build_model(spec, len(tok), seed=args.seed)
    report["target_params"] = llama_configs.count_params(model)
    log(f"target {spec} params {report['target_params']}")
    tspec = TrainSpec(
        args.target_steps,
        args.batch,
        args.seq_len,
        args.target_lr,
        warmup=min(50, args.target_steps),
        seed=args.seed + 1,
    )
    t0 = time.perf_counter()
    report["target_losses"] = train_lm(model, train, tspec, log=log)
    report["target_train_s"] = round(time.perf_counter() - t0, 1)
    save_model(model, tok, args.out / "target", args.target_dtype)
    target = reload_fp32(args.out / "target")
    report["target_heldout_ce"] = evaluate(target, held, args.seq_len)
    report["target_train_spec"] = asdict(tspec)
    log(
        f"target done in {report['target_train_s']}s, held-out CE {report['target_heldout_ce']:.4f}"
    )
    return target


def train_draft(
    args: argparse.Namespace,
    tok: PreTrainedTokenizerFast,
    train: np.ndarray,
    held: np.ndarray,
    target: torch.nn.Module,
    report: dict,
) -> None:
    spec = llama_configs.QUICK_DRAFT if args.quick else llama_configs.DRAFT
    model = llama_configs.build_model(spec, len(tok), seed=args.seed + 2)
    report["draft_params"] = llama_configs.count_params(model)
    log(f"draft {spec} params {report['draft_params']}")
    tspec = TrainSpec(
        args.draft_steps,
        args.batch,
        args.seq_len,
        args.draft_lr,
        warmup=min(50, args.draft_steps),
        seed=args.seed + 3,
    )
    loss_fn = make_distill_loss(target, kl_weight=args.kl_weight)
    t0 = time.perf_counter()
    report["draft_losses"] = train_lm(model, train, tspec, loss_fn=loss_fn, log=log)
    report["draft_train_s"] = round(time.perf_counter() - t0, 1)
    save_model(model, tok, args.out / "draft", args.draft_dtype)
    draft = reload_fp32(args.out / "draft")
    report["draft_heldout_ce"] = evaluate(draft, held, args.seq_len)
    report["heldout_greedy_agreement"] = greedy_agreement(
        draft, target, torch.from_numpy(held.astype(np.int64)), args.seq_len
    )
    report["draft_train_spec"] = asdict(tspec)
    log(
        f"draft done in {report['draft_train_s']}s, held-out CE {report['draft_heldout_ce']:.4f}"
        f", greedy agreement {report['heldout_greedy_agreement']:.3f}"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    train_texts, held_texts = stdlib_corpus.split_corpus()
    if args.max_files:
        train_texts, held_texts = train_texts[: args.max_files], held_texts[:2]
    tok = bpe_tokenizer.train_tokenizer(train_texts, args.vocab)
    train = cached_stream(tok, train_texts, "train")
    held = cached_stream(tok, held_texts, "heldout")
    report: dict = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": args.threads,
        "train_tokens": len(train),
        "heldout_tokens": len(held),
        "train_files": len(train_texts),
        "heldout_files": len(held_texts),
    }
    log(f"corpus: {len(train_texts)} files / {len(train)} tokens, held-out {len(held)} tokens")
    target = train_target(args, tok, train, held, report)
    train_draft(args, tok, train, held, target, report)
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"total {report['total_s']}s -> {args.out}")
    return report


if __name__ == "__main__":
    main()
