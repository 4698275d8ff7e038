"""CUDA graphs captured before an engine's first request (static_pass.StaticPasses.capture_ahead).

The target verifies up to k drafts a row: passes of 1 (plain decoding) to k + 1 tokens, every
logit wanted. The drafter steps one token a row, and first feeds what the last round
committed past what it had fed (the last accepted draft and the verifier's token: 2), each
wanting its last logits. Other lengths (a drafter catching up after plain rounds, short
prompts) and contexts past AHEAD_MAX_CONTEXT are captured on first use.
"""

import logging
import time
from dataclasses import dataclass

from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import Proposer
from daemon.runtime.proposers.draft_model import DraftModelProposer

log = logging.getLogger(__name__)

DRAFT_CHUNKS = (1, 2)  # a drafting step; the feed of a round's last draft and its bonus


def verify_chunks(max_k: int) -> range:
    """Tokens per row of the target's passes: plain decoding (1) to k drafts and the last
    committed token (k + 1)."""
    return range(1, max_k + 2)


@dataclass(frozen=True, slots=True)
class GraphCapture:
    """What an engine captured before its first request."""

    num_graphs: int = 0
    seconds: float = 0.0


def capture_graphs_ahead(
    target: CausalLM, proposer: Proposer | None, max_batch: int, max_k: int
) -> GraphCapture:
    """Capture the target's and the local drafter's decode/verify shapes where they replay
    CUDA graphs (a no-op elsewhere): how many, and how long it took."""
    start = time.perf_counter()
    captured = 0
    if isinstance(target, LlamaForCausalLM) and target.static is not None:
        captured += target.static.capture_ahead(max_batch, verify_chunks(max_k), last_only=False)
    if isinstance(proposer, DraftModelProposer) and max_k > 0:
        draft = proposer.model
        if isinstance(draft, LlamaForCausalLM) and draft.static is not None:
            captured += draft.static.capture_ahead(max_batch, DRAFT_CHUNKS, last_only=True)
    seconds = time.perf_counter() - start
    if captured:
        log.info("captured %d CUDA graphs in %.1f s", captured, seconds)
    return GraphCapture(captured, seconds if captured else 0.0)
