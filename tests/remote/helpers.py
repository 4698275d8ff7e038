"""Engines whose proposer is remote: a DraftServer on a ThreadTransport, the real protocol."""

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.model import load_model
from daemon.runtime.proposers.base import Proposer
from daemon.runtime.remote.builder import DraftServerSpec, build_draft_proposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.remote.remote_proposer import RemoteProposer
from daemon.runtime.remote.thread_transport import ThreadTransport


def perturbed_copy(source: Path, dest: Path, noise: float, seed: int = 5) -> Path:
    """A copy of a checkpoint with Gaussian noise on every weight: a draft that agrees with
    its target often but not always (noise 0.003 on the tiny test model: acceptance ~0.5)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        shutil.copy(path, dest / path.name)
    weights = load_file(str(dest / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    noisy = {k: v + noise * torch.randn(v.shape, generator=gen) for k, v in weights.items()}
    save_file(noisy, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def draft_proposer(draft_dir: Path | None, num_slots: int, **kwargs: object) -> Proposer:
    """What a drafter node runs: a DraftModelProposer on `draft_dir` (max_model_len 256, the
    engine tests' context), or n-gram lookup when it is None."""
    spec = DraftServerSpec(draft=draft_dir, num_slots=num_slots, max_model_len=256)
    for name, value in kwargs.items():
        setattr(spec, name, value)
    return build_draft_proposer(spec)


@dataclass(slots=True)
class RemoteSetup:
    engine: SpecEngine
    remote: RemoteProposer
    transport: ThreadTransport
    server: DraftServer


@contextmanager
def remote_engine(
    target_dir: Path,
    draft_dir: Path | None,
    *,
    mode: str = "overlapped",
    k: int = 4,
    adaptive: bool = False,
    batch: int = 8,
    options: RemoteOptions | None = None,
    latency_s: float = 0.0,
    **proposer_kwargs: object,
) -> Iterator[RemoteSetup]:
    """An engine over the target whose proposer (draft model, or n-gram when draft_dir is
    None) runs behind a DraftServer on its own thread; the transport is closed afterwards."""
    server = DraftServer(draft_proposer(draft_dir, batch, **proposer_kwargs))
    transport = ThreadTransport(server, latency_s=latency_s)
    remote = RemoteProposer(transport, options or RemoteOptions(mode=mode))
    config = EngineConfig(max_batch_size=batch, num_speculative_tokens=k, adaptive=adaptive)
    target = load_model(target_dir, num_slots=batch, max_model_len=256)
    engine = SpecEngine(target, remote, config)
    try:
        yield RemoteSetup(engine, remote, transport, server)
    finally:
        transport.close()
