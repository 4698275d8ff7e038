"""The speculative decoding engine: continuous batching around draft -> verify rounds."""

import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from daemon.runtime.device import synchronize
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.controller import ControllerConfig, SpeculationController
from daemon.runtime.engine.cost_model import CostModel
from daemon.runtime.engine.graphs_ahead import capture_graphs_ahead
from daemon.runtime.engine.prefill import plan_chunks, prefill
from daemon.runtime.engine.proposal_chooser import ProposalChooser
from daemon.runtime.engine.request import Request, RequestDelta, RequestOutput
from daemon.runtime.engine.scheduler import Scheduler
from daemon.runtime.engine.sequence import Sequence
from daemon.runtime.engine.stats import EngineStats, RoundStats
from daemon.runtime.engine.stop import FINISH_ABORT, FINISH_ERROR, StopChecker
from daemon.runtime.engine.verify import verify
from daemon.runtime.errors import RequestError
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.base import Proposals, Proposer, ProposeRequest, empty_proposals
from daemon.runtime.sampling import block_maxima

# a round that first fed the drafter is learned below this share of the drafting price
CATCH_UP_LEARNED = 0.5

logger = logging.getLogger(__name__)

Detokenize = Callable[[list[int]], str]
# handed the new requests' first tokens as soon as their prefill is done, before the round
Prefilled = Callable[[list[RequestDelta]], None]


@dataclass(slots=True)
class StepOutput:
    """What one `step()` did: every request that gained tokens or ended, and the round's stats."""

    deltas: list[RequestDelta] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)  # ended normally or by abort
    stats: RoundStats = field(default_factory=RoundStats)


def _freeze_startup_heap() -> None:
    """Move everything alive now (models, transformers' module graph) out of the garbage
    collector's reach. Without it, collections triggered by each round's small allocations
    walk that whole heap: measured at 60-70% of a round's time on tiny models."""
    gc.collect()
    gc.freeze()


class SpecEngine:
    """Owns the truth: the batch, the target's KV cache, the sampling.

    Each `step()` admits waiting requests into free slots and prefills them (their whole
    prompts, or with `prefill_chunk_tokens` set and others decoding, that many prompt tokens a
    step), then runs one round over the running batch: choose k per sequence, propose, verify,
    commit, retire.
    """

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        config: EngineConfig,
        eos_token_ids: Iterable[int] = (),
        detokenize: Detokenize | None = None,
        first_slot: int = 0,
    ) -> None:
        """first_slot: the engine's sequences take the models' KV-cache slots first_slot ..
        first_slot + max_batch_size - 1, so that engines over the same loaded models, each with
        its own range, can run side by side (bench/spec_engine.py steps them in turn)."""
        if first_slot < 0 or first_slot + config.max_batch_size > target.num_slots:
            raise RequestError(
                f"max batch size {config.max_batch_size} from slot {first_slot} exceeds the "
                f"model's {target.num_slots} KV-cache slots"
            )
        self.target = target
        self.proposer = proposer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.detokenize = detokenize
        self.scheduler = Scheduler(config.max_batch_size, first_slot)
        k = config.num_speculative_tokens if proposer is not None else 0
        self.controller = SpeculationController(
            ControllerConfig(max_k=k, adaptive=config.adaptive, fixed_k=k)
        )
        self.stats = EngineStats()
        self.last_round = RoundStats()
        self._request_ids: set[str] = set()
        self._ended_waiting: list[RequestDelta] = []  # aborted before they started
        # admitted, their prompts not yet all in the target's cache (their slots are taken), in
        # admission order: a step prefills them first come, first served (prefill.plan_chunks)
        self._prefilling: list[Sequence] = []
        self._drafted = False  # a drafting round has run (its time: _learn_draft_cost)
        # listed proposals or coupled drafts for sampled rows, measured (None: as configured)
        self.chooser = (
            ProposalChooser()
            if proposer is not None and config.choose_proposal and config.draft_sparse_top_k > 0
            else None
        )
        # (coupled?, the other form's measuring round?) of a round the chooser learns from
        self._measured: tuple[bool, bool] | None = None
        # before the first request: no sequence is live (capture writes placeholder K/V)
        self.graph_capture = capture_graphs_ahead(target, proposer, config.max_batch_size, k)
        _freeze_startup_heap()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; an invalid one raises RequestError and leaves the engine untouched."""
        self._validate(request)
        self._request_ids.add(request.request_id)
        self.scheduler.add(request)

    def abort(self, request_id: str) -> bool:
        """End a request early; its slot is freed and its last delta reported by the next
        `step()`. False if no such request is queued or running."""
        request = self.scheduler.remove_waiting(request_id)
        if request is not None:
            self._ended_waiting.append(
                RequestDelta(request_id, [], FINISH_ABORT, len(request.prompt_token_ids), 0)
            )
            return True
        seq = self.scheduler.find_running(request_id) or next(
            (s for s in self._prefilling if s.request.request_id == request_id), None
        )
        if seq is None or seq.is_finished:
            return False
        seq.finish(FINISH_ABORT)  # one still prefilling is retired by the next step (_admit)
        return True

    def fail_all(self, message: str) -> list[RequestDelta]:
        """End every queued and running request with an error (after a failed step, whose
        state cannot be trusted) and free every slot; the engine is then empty and usable."""
        deltas = [
            RequestDelta(r.request_id, [], FINISH_ERROR, len(r.prompt_token_ids), 0, error=message)
            for r in self.scheduler.waiting
        ]
        for seq in [*self.scheduler.running, *self._prefilling]:
            seq.finish(FINISH_ERROR)
            # None: it ended on its first token and was reported so before the round
            if (delta := seq.take_delta()) is not None:
                delta.finish_reason, delta.error = FINISH_ERROR, message
                deltas.append(delta)
            try:
                self._free(seq.slot)
            except Exception as exc:  # the step failed already: end the requests regardless
                logger.warning("freeing slot %d after a failed step: %s", seq.slot, exc)
        self.scheduler.waiting.clear()
        self.scheduler.running.clear()
        self._prefilling.clear()
        self.scheduler.free_all()
        self._request_ids.clear()
        deltas.extend(self._ended_waiting)
        self._ended_waiting.clear()
        return deltas

    def set_speculation(
        self, num_speculative_tokens: int, adaptive: bool, forget_costs: bool = False
    ) -> None:
        """Change k (or the adaptive ceiling) between steps; running sequences start fresh
        acceptance estimates of the new length. Measured round costs are kept unless
        `forget_costs`: then the controller starts from nothing, as a new engine's does (its
        first adaptive round drafts at the ceiling, its next one measures plain decoding),
        for when the costs measured so far no longer hold (the machine's load changed) or a
        check wants adaptive's start, not a choice the earlier load made."""
        if self.proposer is None and num_speculative_tokens > 0:
            raise RequestError("this engine has no proposer: k must stay 0")
        config = EngineConfig(
            max_batch_size=self.config.max_batch_size,
            num_speculative_tokens=num_speculative_tokens,
            adaptive=adaptive,
            draft_sparse_top_k=self.config.draft_sparse_top_k,
            draft_sparse_mass=self.config.draft_sparse_mass,
            draft_sparse_max_listed=self.config.draft_sparse_max_listed,
            choose_proposal=self.config.choose_proposal,
            max_prefill_tokens=self.config.max_prefill_tokens,
            prefill_chunk_tokens=self.config.prefill_chunk_tokens,
        )
        costs = CostModel() if forget_costs else self.controller.costs
        self.config = config
        self.controller = SpeculationController(
            ControllerConfig(
                max_k=num_speculative_tokens, adaptive=adaptive, fixed_k=num_speculative_tokens
            ),
            costs=costs,
        )
        for seq in [*self.scheduler.running, *self._prefilling]:
            seq.acceptance = self.controller.new_estimate()

    def check_request(self, request: Request) -> None:
        """Raise RequestError if the engine could never serve `request` (empty or too long
        prompt, token ids outside the vocabulary). Reads no mutable state: any thread may call
        it before handing the request to the thread that drives the engine."""
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise RequestError(f"request {request.request_id!r}: the prompt is empty")
        if num_prompt >= self.target.max_model_len:
            raise RequestError(
                f"request {request.request_id!r}: the prompt has {num_prompt} tokens but the "
                f"context holds {self.target.max_model_len} (prompt plus at least one new token)"
            )
        vocab = self.target.vocab_size
        bad = [t for t in request.prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(
                f"request {request.request_id!r}: prompt token ids {bad[:5]} are outside "
                f"the vocabulary [0, {vocab})"
            )

    def _validate(self, request: Request) -> None:
        if request.request_id in self._request_ids:
            raise RequestError(f"request id {request.request_id!r} is already in use")
        self.check_request(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or bool(self._ended_waiting) or bool(self._prefilling)

    @property
    def num_running(self) -> int:
        """Sequences holding a slot: decoding, or their prompt still being prefilled."""
        return len(self.scheduler.running) + len(self._prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def generate(self, requests: Iterable[Request]) -> list[RequestOutput]:
        """Run requests to completion; outputs in the order of the requests. All requests are
        checked before any is queued, so one bad request leaves the engine untouched."""
        batch = list(requests)
        ids = [req.request_id for req in batch]
        if len(set(ids)) != len(ids):
            raise RequestError("request ids in one generate() call must be distinct")
        for req in batch:
            self._validate(req)
        for req in batch:
            self.add_request(req)
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step().finished:
                done[out.request_id] = out
        return [done[rid] for rid in ids]

    # -- one step ---------------------------------------------------------------------------
    def step(self, on_prefilled: Prefilled | None = None) -> StepOutput:
        """Admit, run one round, retire; report what every request gained in this step.
        `on_prefilled` gets the admitted requests' first tokens (sampled by the prefill) before
        the round runs: a stream's first token need not wait for the batch's round. Those
        deltas are not in the step's output again."""
        out = StepOutput(deltas=self._ended_waiting)
        self._ended_waiting = []
        self._measured = None  # set by this step's round (not left by one that raised)
        stats = out.stats
        start = time.perf_counter()
        with torch.inference_mode():
            new = self._admit(stats)
            if on_prefilled is not None and new:
                handed = time.perf_counter()
                firsts = [d for d in (seq.take_delta() for seq in new) if d is not None]
                if firsts:
                    on_prefilled(firsts)
                stats.hand_out_time_s = time.perf_counter() - handed
            running = [s for s in self.scheduler.running if not s.is_finished]
            if running:
                self._round(running, stats)
        # the round's logits are done with: their block maxima must not keep them alive
        block_maxima.clear()
        for seq in self.scheduler.running:
            delta = seq.take_delta()
            if delta is not None:
                out.deltas.append(delta)
        out.finished = self._retire()
        stats.step_time_s = time.perf_counter() - start
        measured, self._measured = self._measured, None
        # Neither learns from a round that sequences joined (its drafting feeds the drafter
        # their prompts first). A step that only put chunks of prompts in the cache teaches
        # both (the step less its prefill): with prompts going in a chunk a step under load
        # (prefill_chunk_tokens), nearly every step carries one, and skipping them all left
        # the overhead line unlearned and a block of the chooser's measuring rounds unended.
        if measured is not None and self.chooser is not None and not new:
            self.chooser.observe(
                stats.batch_size, measured[0], stats.num_emitted_tokens, stats.round_time_s
            )
        exploring = measured is not None and measured[1]
        if stats.batch_size and not new and not exploring:
            self.controller.costs.record_overhead(
                stats.batch_size, stats.speculation_len, stats.overhead_time_s
            )
        self.last_round = stats
        if stats.batch_size or stats.num_prefill_seqs:
            self.stats.add(stats)
        return out

    def _admit(self, stats: RoundStats) -> list[Sequence]:
        """Take the waiting requests that fit into free slots and prefill what this step may;
        returns the sequences whose prompt is now all in (they run from this step's round on).

        With `prefill_chunk_tokens` set, a step prefills at most that many prompt tokens while
        other sequences decode: a long prompt (or a burst of them) then holds every stream's
        next tokens back by a chunk's time a step, not by the whole prefill's. With none
        decoding, nothing waits on the prefill, and the prompts go in whole."""
        while self.scheduler.can_admit():
            request, slot = self.scheduler.admit()
            self._prefilling.append(self._new_sequence(request, slot))
        aborted = [s for s in self._prefilling if s.is_finished]
        if aborted:  # into the batch, whose retirement reports them and frees their slots
            self._prefilling = [s for s in self._prefilling if not s.is_finished]
            for seq in aborted:
                self.scheduler.start(seq)
        if not self._prefilling:
            return []
        decoding = any(not s.is_finished for s in self.scheduler.running)
        chunks = plan_chunks(
            self._prefilling, self.config.prefill_chunk_tokens if decoding else None
        )
        t0 = time.perf_counter()
        try:
            prefill(self.target, chunks, self.config.max_prefill_tokens)
        finally:  # what went in whole runs, even after a failed pass (fail_all finds it there)
            done = [s for s in self._prefilling if s.num_prefilled == s.num_prompt_tokens]
            if done:
                self._prefilling = [
                    s for s in self._prefilling if s.num_prefilled < s.num_prompt_tokens
                ]
                for seq in done:
                    self.scheduler.start(seq)
        if self.proposer is not None and done:
            self.proposer.admit(
                [s.slot for s in done], [list(s.request.prompt_token_ids) for s in done]
            )
        synchronize(self.target.device)  # the prefill is queued, not yet done
        stats.prefill_time_s = time.perf_counter() - t0
        stats.num_prefill_seqs = len(chunks)
        stats.num_prefill_tokens = sum(c.num_tokens for c in chunks)
        return done

    def _new_sequence(self, request: Request, slot: int) -> Sequence:
        stop = StopChecker(
            params=request.params,
            eos_token_ids=self.eos_token_ids,
            max_total_len=self.target.max_model_len,
            detokenize=self.detokenize,
        )
        seq = Sequence(request, slot, stop, self.controller.new_estimate())
        if self.proposer is not None:  # it takes the prompt at the sequence's first drafts
            seq.drafter_behind = seq.num_prompt_tokens
        return seq

    def _round(self, seqs: list[Sequence], stats: RoundStats) -> None:
        started = time.perf_counter()
        ks = self.controller.choose(
            [s.acceptance for s in seqs],
            [self._k_limit(s) for s in seqs],
            behind=[s.drafter_behind for s in seqs],
            left=[s.request.params.max_tokens - s.num_output_tokens for s in seqs],
        )
        stats.choose_time_s = time.perf_counter() - started
        batch = len(seqs)
        coupled, exploring = self._proposal_form(seqs, ks)
        proposals = self._propose(seqs, ks, coupled)
        verdict = verify(self.target, seqs, proposals)
        self.controller.costs.record_verify(batch, verdict.tokens_per_seq, verdict.verify_time_s)
        max_k = max(proposals.num_draft_tokens, default=0)
        # a row asked for drafts that got none while the drafter was behind on it: the
        # drafter is taking its prompt in a chunk a round (prefill_chunk_tokens). Such rounds,
        # and the one that ends the feeding, cost neither drafting's price nor a catch-up of
        # `drafter_behind` tokens: not learned from
        feeding = False
        for s, k, n in zip(seqs, ks, proposals.num_draft_tokens, strict=True):
            s.drafter_feeding = s.drafter_feeding or bool(k and not n and s.drafter_behind)
            feeding = feeding or (s.drafter_feeding and bool(k))
        if max_k and not exploring and not feeding:  # the other form's drafting costs its own
            behind = max(s.drafter_behind for s, k in zip(seqs, ks, strict=True) if k)
            self._learn_draft_cost(batch, max_k, proposals.draft_time_s, behind)
        stats.batch_size, stats.speculation_len = batch, max(ks, default=0)
        stats.draft_time_s, stats.verify_time_s = proposals.draft_time_s, verdict.verify_time_s
        stats.accepted_per_pos = [0] * max_k
        for seq, num_draft, num_acc, emitted in zip(
            seqs, proposals.num_draft_tokens, verdict.num_accepted, verdict.emitted, strict=True
        ):
            self._commit(seq, num_draft, num_acc, emitted, stats)

    def _proposal_form(self, seqs: list[Sequence], ks: list[int]) -> tuple[bool, bool]:
        """(whether this round's sampled drafts go coupled, whether that is the other form's
        measuring round: its drafting and sampling costs are not the cost model's to learn).
        The chooser learns from rounds in which some sampled row drafts. A round with a seeded
        sampled row drafting keeps the configured (listed) form and is not measured: a seed
        asks for the same tokens again, and which form runs changes them."""
        if self.chooser is None:
            return False, False
        batch = len(seqs)
        sampled = [
            s.request.params for s, k in zip(seqs, ks, strict=True) if k > 0
            and not s.request.params.is_greedy
        ]  # fmt: skip
        if any(p.seed is not None for p in sampled):
            return False, False
        if not sampled:
            return self.chooser.form(batch), False
        coupled = self.chooser.choose(batch)
        self._measured = coupled, coupled != self.chooser.form(batch)
        return self._measured

    def _learn_draft_cost(self, batch: int, k: int, seconds: float, behind: int) -> None:
        """Teach the cost model a drafting round's time, except where it says more about the
        round than about drafting:
          * the engine's first drafting round pays one-time costs (on an H200, sampled: 134 ms
            for 7 steps that later cost ~1.3 ms each). Learned, it priced drafting at 19 ms a
            step, plain decoding won, and the price was never measured again. It is noted
            as the price of feeding the drafter until a catch-up is learned (cost_model.py);
          * a round that first fed the drafter what plain rounds committed costs more than
            drafting does: learning from it priced every step as a catch-up (on an H200 1.8 ms
            against 0.47), and plain decoding then always looked better. Its time is still an
            upper bound on drafting's, so it is learned where it is below half the model's
            price for those steps: a price that far off is corrected by the rounds after
            plain ones, and the lucky half of catch-ups that cost about the price does not
            bias it low (learning every one below the price would).
        A catch-up's own cost (`behind`: the most tokens a drafting row had to feed first) is
        learned apart, as what it costs beyond the steady price: it is what an exploratory
        round from plain decoding pays (controller.py)."""
        first = not self._drafted
        self._drafted = True
        costs = self.controller.costs
        if first:
            costs.record_first_catch_up(batch, behind, seconds)
            return
        if behind:
            costs.record_catch_up(batch, k, behind, seconds)
            if seconds >= CATCH_UP_LEARNED * costs.draft_cost(batch, k):
                return
        costs.record_draft(batch, k, seconds)

    def _commit(
        self,
        seq: Sequence,
        num_draft: int,
        num_accepted: int,
        emitted: list[int],
        stats: RoundStats,
    ) -> None:
        seq.num_rounds += 1
        seq.num_draft_tokens += num_draft
        seq.num_accepted_tokens += num_accepted
        self.controller.observe(seq.acceptance, num_draft, num_accepted)
        stats.num_drafts += int(num_draft > 0)
        stats.num_draft_tokens += num_draft
        stats.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            stats.accepted_per_pos[pos] += 1
        appended = seq.append(emitted)
        seq.drafter_behind = 0 if num_draft else seq.drafter_behind + appended
        seq.drafter_feeding = seq.drafter_feeding and not num_draft
        stats.num_emitted_tokens += appended

    def _k_limit(self, seq: Sequence) -> int:
        """Most drafts worth asking for: room in the context and tokens left to generate."""
        room = self.target.max_model_len - len(seq.token_ids)
        left = seq.request.params.max_tokens - seq.num_output_tokens - 1
        return max(0, min(self.controller.config.max_k, room, left))

    def _propose(self, seqs: list[Sequence], ks: list[int], coupled: bool) -> Proposals:
        if self.proposer is None or not any(ks):
            return empty_proposals(len(seqs))
        return self.proposer.propose(
            ProposeRequest(
                slots=[s.slot for s in seqs],
                token_ids=[s.token_ids for s in seqs],
                num_to_draft=ks,
                params=[s.request.params for s in seqs],
                draft_seeds=[s.draft_seed for s in seqs],
                coupled=coupled,
            )
        )

    def _retire(self) -> list[RequestOutput]:
        outputs = []
        for seq in self.scheduler.retire_finished():
            self._free(seq.slot)
            self._request_ids.discard(seq.request.request_id)
            outputs.append(seq.to_output())
        return outputs

    def _free(self, slot: int) -> None:
        self.target.free_slot(slot)
        if self.proposer is not None:
            self.proposer.release(slot)
