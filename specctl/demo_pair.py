"""Where the project's own demo model pair and its held-out prompts live."""

from pathlib import Path

from daemon.runtime.errors import ModelLoadError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_MODELS = REPO_ROOT / "packaging" / "demo-models"
DEMO_PROMPTS = REPO_ROOT / "packaging" / "demo_models" / "prompts"
DEMO_PROMPTS_CODE = DEMO_PROMPTS / "code.jsonl"
DEMO_PROMPTS_PROSE = DEMO_PROMPTS / "prose.jsonl"


def demo_pair_dirs() -> tuple[Path, Path]:
    """(target, draft) directories of the bundled demo pair."""
    return DEMO_MODELS / "target", DEMO_MODELS / "draft"


def require_demo_pair() -> tuple[Path, Path]:
    target, draft = demo_pair_dirs()
    for path in (target, draft):
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"the demo model pair is missing ({path}); it ships with the repository — "
                "check out the full tree, or rebuild it with "
                "`python packaging/demo_models/train.py --out packaging/demo-models`"
            )
    return target, draft
