"""`train.py --quick` produces loadable Hugging Face directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "packaging" / "demo_models" / "train.py"


def test_quick_training_run(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cmd = [sys.executable, str(TRAIN), "--quick", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    report = json.loads((out / "train_report.json").read_text())
    assert report["target_params"]["total"] > report["draft_params"]["total"]
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(out / name)
        tok = AutoTokenizer.from_pretrained(out / name)
        assert model.config.head_dim == 64
        assert model.config.vocab_size == len(tok)
