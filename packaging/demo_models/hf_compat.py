"""Make saved directories readable by older transformers (4.x) and vLLM as well as by 5.x.

transformers 5 writes `dtype`, `rope_parameters`, `tokenizer_class: TokenizersBackend`,
`extra_special_tokens` and a separate chat_template.jinja; older readers expect
`torch_dtype`, `rope_theta`, `PreTrainedTokenizerFast`, `additional_special_tokens` and the
chat template inside tokenizer_config.json. Both spellings are kept where harmless.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def _rewrite(path: Path, fn: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def patch_config(model_dir: Path) -> None:
    def fix(cfg: dict) -> None:
        if "dtype" in cfg:
            cfg["torch_dtype"] = cfg["dtype"]
        rope = cfg.get("rope_parameters") or {}
        if "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]

    _rewrite(model_dir / "config.json", fix)


def patch_tokenizer_config(model_dir: Path) -> None:
    jinja = model_dir / "chat_template.jinja"
    template = jinja.read_text() if jinja.exists() else None

    def fix(cfg: dict) -> None:
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        extra = cfg.pop("extra_special_tokens", None)
        if isinstance(extra, list):
            cfg["additional_special_tokens"] = extra
        if template is not None:
            cfg["chat_template"] = template

    _rewrite(model_dir / "tokenizer_config.json", fix)
    if template is not None:
        jinja.unlink()
