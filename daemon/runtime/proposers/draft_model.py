"""A separate small draft model as proposer.

The draft keeps its own KV cache in step with the verifier lazily: it remembers which tokens
it has cached past the last committed prefix (its own drafts) and, next round, keeps exactly
the part of them that the verifier committed — a rollback by moving a length, never a copy.
"""

import time
from dataclasses import dataclass, field

from daemon.runtime.model.batch import ForwardBatch, LogitsMode, group_by_length
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import (
    PLACEHOLDER_TOKEN_ID,
    Proposals,
    ProposeRequest,
    empty_proposals,
)
from daemon.runtime.proposers.draft_sampling import DraftSampler


@dataclass(slots=True)
class _SlotState:
    committed_len: int  # leading tokens of the sequence held in the draft cache, all committed
    speculative: list[int] = field(default_factory=list)  # own drafts cached after them


@dataclass(slots=True)
class _Active:
    """One sequence drafting this round."""

    row: int  # row in the ProposeRequest
    slot: int
    num_to_draft: int
    next_pos: int  # absolute position of the next token to feed
    chunk: list[int]  # tokens to feed next (catch-up tail first, then one draft at a time)


class DraftModelProposer:
    """Drafts with a causal LM sharing the target's vocabulary."""

    name = "draft_model"

    def __init__(
        self, model: CausalLM, sparse_top_k: int = 32, max_prefill_tokens: int = 8192
    ) -> None:
        self.model = model
        self.max_prefill_tokens = max_prefill_tokens  # padded tokens per prefill pass
        self.sampler = DraftSampler(sparse_top_k=sparse_top_k)
        self._states: dict[int, _SlotState] = {}

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        for group in group_by_length([len(p) for p in prompts], self.max_prefill_tokens):
            self._prefill([slots[i] for i in group], [prompts[i] for i in group])

    def _prefill(self, slots: list[int], prompts: list[list[int]]) -> None:
        batch = ForwardBatch(slots, prompts, [0] * len(slots), LogitsMode.NONE)
        self.model.forward(batch)
        for slot, prompt in zip(slots, prompts, strict=True):
            self._states[slot] = _SlotState(committed_len=len(prompt))

    def release(self, slot: int) -> None:
        self._states.pop(slot, None)
        self.model.free_slot(slot)

    def propose(self, request: ProposeRequest) -> Proposals:
        num_seqs = len(request.slots)
        active = [
            self._activate(request, row) for row in range(num_seqs) if request.num_to_draft[row] > 0
        ]
        if not active:
            return empty_proposals(num_seqs)
        start = time.perf_counter()
        self.sampler.begin(request, max(a.num_to_draft for a in active))
        step = 0
        while active:
            logits = self.model.forward(  # [A, V]
                ForwardBatch(
                    [a.slot for a in active],
                    [a.chunk for a in active],
                    [a.next_pos for a in active],
                    LogitsMode.LAST,
                )
            )
            assert logits is not None
            tokens = self.sampler.sample(logits, [a.row for a in active], step)
            active = self._advance(active, tokens, step)
            step += 1
        proposals = self.sampler.finish()
        proposals.draft_time_s = time.perf_counter() - start
        return proposals

    def _activate(self, request: ProposeRequest, row: int) -> _Active:
        """Roll the slot's cache back to what the verifier committed; queue the catch-up tail."""
        slot, tokens = request.slots[row], request.token_ids[row]
        state = self._states[slot]
        new = tokens[state.committed_len :]
        keep = 0
        for mine, theirs in zip(state.speculative, new, strict=False):
            if mine != theirs:
                break
            keep += 1
        # Always re-feed at least the last token: its logits give the first draft.
        cached = min(state.committed_len + keep, len(tokens) - 1)
        state.committed_len, state.speculative = len(tokens), []
        return _Active(row, slot, request.num_to_draft[row], cached, tokens[cached:])

    def _advance(self, active: list[_Active], tokens: list[int], step: int) -> list[_Active]:
        """Feed each new draft next step; drop sequences that have drafted enough."""
        still: list[_Active] = []
        for act, token in zip(active, tokens, strict=True):
            if token == PLACEHOLDER_TOKEN_ID or step + 1 >= act.num_to_draft:
                continue
            self._states[act.slot].speculative.append(token)
            act.next_pos += len(act.chunk)
            act.chunk = [token]
            still.append(act)
        return still
