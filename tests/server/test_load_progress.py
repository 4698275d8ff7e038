"""Loading progress: load_model reports bytes loaded of the total, build_engine names the model."""

from pathlib import Path

import pytest

from daemon.runtime.engine.builder import EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.model import load_model
from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("progress")
    target = make_tiny_checkpoint(root / "target", seed=0, sharded=True)
    draft = make_tiny_checkpoint(root / "draft", seed=1, hidden_size=32, num_heads=2)
    return target, draft


@pytest.mark.parametrize("backend", ["lean", "hf"])
def test_load_model_reports_bytes_up_to_the_total(pair: tuple[Path, Path], backend: str) -> None:
    seen: list[tuple[int, int]] = []
    model = load_model(
        pair[0], backend=backend, num_slots=1, progress=lambda d, t: seen.append((d, t))
    )
    assert model.vocab_size == 320
    assert len(seen) >= 2
    totals = {t for _, t in seen}
    assert len(totals) == 1 and totals.pop() > 0
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == seen[-1][1]


def test_build_engine_names_each_model(pair: tuple[Path, Path]) -> None:
    seen: list[tuple[str, int, int]] = []
    spec = EngineSpec(
        target=pair[0], draft=pair[1], engine=EngineConfig(max_batch_size=1), max_model_len=64
    )
    build_engine(spec, progress=lambda name, d, t: seen.append((name, d, t)))
    names = [name for name, _, _ in seen]
    assert names.index("draft") > names.index("target")  # target first, then draft
    for name in ("target", "draft"):
        last = [(d, t) for n, d, t in seen if n == name][-1]
        assert last[0] == last[1] > 0
