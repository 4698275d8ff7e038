"""How a draft model turns one step's logits into draft tokens.

Greedy rows draft the argmax (a point mass). With `sparse_top_k` = 0, or for a request that
asks for it (`ProposeRequest.coupled`: engine/proposal_chooser.py), coupled drafting: sampled
rows draft argmax (log q + G), G the Gumbel field of (draft seed, position), and send
the token alone: the verifier matches it against its own argmax (log p + G) (see
sampling/rejection.py). Otherwise sampled rows draft from the draft's own
distribution at the request's temperature, sent as its most likely tokens (at most
`sparse_top_k`, and no more than it takes to cover `sparse_mass` of the distribution) and a
tail (the rest of the mass), quantised to integer counts out of N = 2^15
(sampling/quantized.py). The integer draw of (draft seed, absolute position) picks the entry
whose cumulative count range holds it (sampling/keyed_random.py); a draw in the tail's range
picks the unlisted token that maximises log q + G, G the Gumbel field of (draft seed,
position) (sampling/gumbel_field.py): a sample from the draft's own distribution over the
unlisted tokens, which the verifier couples with its own (see sampling/rejection.py). The
counts are what the verifier receives, and the same prefix drafts the same token wherever and
whenever it is drafted.

With `with_alternatives`, every row also reports the draft's best tokens at that position
and their probabilities (its guesses for a correction there, used to plan pre-drafted
branches; for a coupled row the runners-up of its race, where the verifier's own draw falls
when it is not the draft); without, only the token (no extra work over the vocabulary).
"""

from dataclasses import dataclass

import torch

from daemon.runtime.host_tensors import float32_tensor
from daemon.runtime.proposers.drafts import SparseDraw
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.draft_lists import draft_lists
from daemon.runtime.sampling.gumbel_field import field_keys, gumbel_argmax, gumbel_topk
from daemon.runtime.sampling.keyed_random import keyed_draw, keyed_u64
from daemon.runtime.sampling.logits import log_normalizers, top_k
from daemon.runtime.sampling.quantized import (
    PROPOSAL_BITS,
    PROPOSAL_TOTAL,
    quantize_and_draw,
    unlisted_token,
)
from daemon.runtime.sampling.wide_list import wide_lists

TAIL_SALT = 0x5851F42D4C957F2D  # the fallback tail token's stream (no unlisted mass left)


@dataclass(slots=True)
class RowKey:
    """What a row's draft depends on besides its logits."""

    temperature: float  # 0: greedy
    draft_seed: int
    position: int  # absolute position of the token being drafted
    # a sampled row whose best sparse_top_k tokens cover less of q than this lists up to
    # max_listed instead, until they cover it (proposers/tail_verdicts.py); 0: never
    listing_mass: float = 0.0


@dataclass(slots=True)
class DraftStep:
    token: int
    sparse: SparseDraw | None  # None: greedy (a point mass)
    alternatives: list[int]  # the draft's best tokens here, best first
    alternative_probs: list[float]  # their probabilities (temperature 1 for greedy rows)
    token_prob: float  # the probability of `token` itself


class DraftSampler:
    def __init__(
        self,
        sparse_top_k: int,
        num_alternatives: int = 1,
        sparse_mass: float = 1.0,
        max_listed: int | None = None,
    ) -> None:
        if sparse_top_k < 0:
            raise ValueError(f"sparse_top_k must be >= 0, got {sparse_top_k}")
        if num_alternatives < 1:
            raise ValueError(f"num_alternatives must be >= 1, got {num_alternatives}")
        if not 0.0 < sparse_mass <= 1.0:
            raise ValueError(f"sparse_mass must be in (0, 1], got {sparse_mass}")
        max_listed = sparse_top_k if max_listed is None else max_listed
        if max_listed < sparse_top_k:
            raise ValueError(
                f"max_listed ({max_listed}) must be >= sparse_top_k ({sparse_top_k}): a wider "
                "list is the base list and more"
            )
        self.sparse_top_k = sparse_top_k  # 0: coupled drafts, no proposal beyond the token
        self.sparse_mass = sparse_mass  # list tokens until they cover this much of q
        self.num_alternatives = num_alternatives  # best tokens reported per row
        self.max_listed = max_listed  # tokens a row's list may widen to (RowKey.listing_mass)
        self.num_widened_rows = 0  # rows that listed past sparse_top_k, since construction
        # the current call's sampled rows draft coupled even where sparse_top_k lists
        # (ProposeRequest.coupled; set by the proposer for each request)
        self.coupled_round = False

    @property
    def is_coupled(self) -> bool:
        """Whether sampled rows draft coupled now (the token alone, no list)."""
        return self.sparse_top_k == 0 or self.coupled_round

    def sample(
        self,
        logits: torch.Tensor,
        keys: list[RowKey],
        with_alternatives: bool = True,
    ) -> list[DraftStep]:
        """logits [A, V] float32, one key per row -> one draft per row (the logits are left as
        they were)."""
        sampled = [i for i, key in enumerate(keys) if key.temperature > 0.0]
        coupled = self.is_coupled
        best_ids = [[-1]] * len(keys)  # sampled rows: their token, set below
        best_probs = [[1.0]] * len(keys)  # not estimated
        if with_alternatives:  # the draft's likeliest tokens (coupled rows: their race, below)
            ranked = [i for i, key in enumerate(keys) if key.temperature <= 0.0 or not coupled]
            if ranked:
                rows = logits if len(ranked) == len(keys) else logits[ranked]
                ids, probs = self.best(rows, [keys[i].temperature for i in ranked])
                for i, row_ids, row_probs in zip(ranked, ids, probs, strict=True):
                    best_ids[i], best_probs[i] = row_ids, row_probs
        else:
            greedy = [i for i, key in enumerate(keys) if key.temperature <= 0.0]
            if greedy:  # a pass over the vocabulary: only for the rows that use it
                rows = logits if len(greedy) == len(keys) else logits[greedy]
                for i, token in zip(greedy, argmax_last(rows).tolist(), strict=True):
                    best_ids[i] = [token]
        steps = [
            DraftStep(ids[0], None, ids, probs, probs[0])
            for ids, probs in zip(best_ids, best_probs, strict=True)
        ]
        if sampled and coupled:  # the field's pick, a point mass
            rows_logits = logits if len(sampled) == len(keys) else logits[sampled]
            sampled_keys = [keys[i] for i in sampled]
            if with_alternatives:  # the race's order: where the verifier's draw falls next
                ranked, ranked_probs = self._coupled_ranking(
                    rows_logits, sampled_keys, self.num_alternatives
                )
            else:
                tokens = self._couple_rows(rows_logits, sampled_keys)
                ranked = [[t] if t >= 0 else [] for t in tokens]
                ranked_probs = [[1.0]] * len(tokens)  # not estimated
            for i, ids, probs in zip(sampled, ranked, ranked_probs, strict=True):
                step = steps[i]
                if not ids:  # every logit -inf (no distribution): any token will do
                    step.token = int(argmax_last(logits[i]))
                    step.alternatives = [step.token]
                    continue
                step.token, step.token_prob = ids[0], probs[0]
                step.alternatives, step.alternative_probs = ids, probs
        elif sampled:
            # every row sampled: no [A, V] copy
            rows_logits = logits if len(sampled) == len(keys) else logits[sampled]
            rows = self._sample_rows(rows_logits, [keys[i] for i in sampled])
            for i, (token, sparse) in zip(sampled, rows, strict=True):
                step = steps[i]
                step.token, step.sparse = token, sparse
                if with_alternatives:
                    step.token_prob = _prob_of(sparse, token)
                else:  # no guesses beyond the token itself
                    step.alternatives = [token]
        return steps

    def best(
        self, logits: torch.Tensor, temperatures: list[float], num: int | None = None
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The `num` (default num_alternatives) most likely tokens of each row [A, V] and their
        probabilities at the row's temperature (1 for greedy rows), best first."""
        num = min(num or self.num_alternatives, logits.shape[-1])
        temps = torch.tensor([t if t > 0.0 else 1.0 for t in temperatures], device=logits.device)
        scaled = logits / temps.unsqueeze(-1)  # [A, V]
        top, ids = top_k(scaled, num)  # [A, W]
        probs = (top - torch.logsumexp(scaled, dim=-1, keepdim=True)).exp()
        return ids.tolist(), probs.tolist()

    def guesses(
        self, logits: torch.Tensor, keys: list[RowKey], num: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The draft's guesses [A][<= num] for the token the verifier emits at each row's
        position when it accepts every draft (the bonus), best first, and their probabilities
        under the draft. Greedy rows: the draft's likeliest tokens. Sampled rows: first the
        Gumbel-max of the draft's distribution with the position's field, the verifier's own
        rule for the bonus with p in place of q (sampling/coupled_bonus.py), then the runners-up
        of the same race (the verifier's draw when it is not the first, for p near q).
        `logits` [A, V] are left as they were."""
        num = min(num, logits.shape[-1])
        ids: list[list[int]] = [[] for _ in keys]
        probs: list[list[float]] = [[] for _ in keys]
        sampled = [i for i, key in enumerate(keys) if key.temperature > 0.0]
        if sampled:
            rows = logits if len(sampled) == len(keys) else logits[sampled]
            ranked, ranked_probs = self._coupled_ranking(rows, [keys[i] for i in sampled], num)
            for i, row_ids, row_probs in zip(sampled, ranked, ranked_probs, strict=True):
                ids[i], probs[i] = row_ids, row_probs
        # greedy rows, and sampled rows whose every logit is -inf: the likeliest tokens
        rest = [i for i, row_ids in enumerate(ids) if not row_ids]
        if rest:
            rows = logits if len(rest) == len(keys) else logits[rest]
            best_ids, best_probs = self.best(rows, [keys[i].temperature for i in rest], num)
            for i, row_ids, row_probs in zip(rest, best_ids, best_probs, strict=True):
                ids[i], probs[i] = row_ids, row_probs
        return ids, probs

    @staticmethod
    def _coupled_ranking(
        logits: torch.Tensor, keys: list[RowKey], num: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """logits [A', V] of sampled rows (left as they were) -> per row the first `num`
        tokens of the race argmax_i (log q_i + G_i), G the field of (draft seed, position),
        and their probabilities under q. The first is the coupled draft (or bonus guess);
        when the verifier's own draw argmax_i (log p_i + G_i) differs, it is most likely one
        of the runners-up (the same noise, p near q), so they are the guesses for a
        correction. Rows whose every logit is -inf: empty."""
        num = min(num, logits.shape[-1])
        temps = torch.tensor([k.temperature for k in keys], device=logits.device)  # [A']
        field = field_keys([k.draft_seed for k in keys], [k.position for k in keys])
        picked = gumbel_topk(logits, field, num, noise_scale=temps)  # [A', num]
        scaled = logits / temps.unsqueeze(-1)  # [A', V] log q up to a constant per row
        log_q = scaled.gather(-1, picked.clamp(min=0)) - torch.logsumexp(
            scaled, dim=-1, keepdim=True
        )  # [A', num]
        ids, probs = [], []
        for row_ids, row_probs in zip(picked.tolist(), log_q.exp().tolist(), strict=True):
            kept = [(t, p) for t, p in zip(row_ids, row_probs, strict=True) if t >= 0]
            ids.append([t for t, _ in kept])
            probs.append([p for _, p in kept])
        return ids, probs

    @staticmethod
    def _couple_rows(logits: torch.Tensor, keys: list[RowKey]) -> list[int]:
        """logits [A', V] of sampled rows (left as they were) -> each row's
        argmax_i (log q_i + G_i), G the field of (draft seed, position): the token the verifier
        draws there when q is its own distribution (rejection.py, coupled_bonus.py); -1 where
        every logit is -inf."""
        temps = float32_tensor([k.temperature for k in keys])  # [A']
        field = field_keys([k.draft_seed for k in keys], [k.position for k in keys])
        # [A'] argmax (logits / T + G) as argmax (logits + T G): no pass dividing [A', V]
        return gumbel_argmax(logits, field, noise_scale=temps).tolist()

    def _sample_rows(
        self, logits: torch.Tensor, keys: list[RowKey]
    ) -> list[tuple[int, SparseDraw]]:
        """logits [A', V] of sampled rows (left as they were) -> (token, counts it was drawn
        from) per row. q = softmax(logits / T) is never written out: its top S by the logits'
        order, their probabilities from the rows' log denominators (one read of the logits),
        and the tail's token by the Gumbel race on the logits at temperature T."""
        vocab_size = logits.shape[-1]
        temperatures = [k.temperature for k in keys]
        widens = self.max_listed > self.sparse_top_k and vocab_size > self.sparse_top_k
        # [A'] the mass each row's list should cover, at most sparse_mass; the rows whose
        # base list leaves more than the rest of it to the tail's coupling widen
        wide_mass = [min(k.listing_mass, self.sparse_mass) for k in keys] if widens else []
        if self.sparse_mass == 1.0:  # every step below in one C call, where it runs
            fast = draft_lists(
                logits, temperatures, [k.draft_seed for k in keys], [k.position for k in keys],
                wide_mass or [0.0] * len(keys), self.sparse_top_k, self.max_listed,
            )  # fmt: skip
            if fast is not None:
                self.num_widened_rows += fast.num_widened
                return self._finish_rows(
                    logits, keys, fast.ids, fast.counts, fast.tails, fast.tokens, fast.excluded
                )
        temps = torch.tensor(temperatures)  # [A'] on the host
        on_device = temps.to(logits.device)
        log_norms = log_normalizers(logits, on_device)  # [A'] one read of the logits
        top, ids = self._listed(logits, on_device, log_norms, self.sparse_top_k)  # [A', S]
        if self.sparse_mass < 1.0:  # list no more than it takes to cover sparse_mass
            top = torch.where(top.cumsum(dim=-1) - top < self.sparse_mass, top, 0.0)
        if widens:
            masses = torch.tensor(wide_mass, dtype=torch.float64)  # [A']
            # the base list's mass in doubles, summed left to right (as the C call sums it)
            short = (top.double().cumsum(dim=-1)[:, -1] < masses).nonzero().flatten()
            if len(short):
                top, ids = self._widened(logits, on_device, log_norms, top, ids, short, masses)
        return self._draw_rows(logits, keys, top, ids)

    def _listed(
        self, logits: torch.Tensor, temps: torch.Tensor, log_norms: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [A', V], temps [A'] and log normalisers [A'] on the logits' device -> q at
        each row's best `width` tokens [A', S] float32 and their ids [A', S] int64, best first,
        on the host (small tensors; no-ops on a CPU)."""
        top_logits, ids = top_k(logits, min(width, logits.shape[-1]))  # [A', S]
        top = (
            (top_logits.double() / temps.double().unsqueeze(-1))
            .sub_(log_norms.unsqueeze(-1))
            .exp_()
            .float()
            .cpu()
        )
        return top, ids.cpu()

    def _widened(
        self,
        logits: torch.Tensor,
        temps: torch.Tensor,
        log_norms: torch.Tensor,
        top: torch.Tensor,
        ids: torch.Tensor,
        short: torch.Tensor,
        wide_mass: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The base lists top, ids [A', S]; `short` [W] the rows that list instead their best
        whole bins of log q down to wide_mass [A'], at most max_listed tokens
        (sampling/wide_list.py) -> top, ids [A', M] (M = max(S, listed); not listed: q 0,
        padding). A row whose best bin alone is over the budget keeps its base list."""
        if len(short) == top.shape[0]:  # every row (in order): no gathers
            row_temps, row_norms, targets = temps, log_norms, wide_mass
        else:
            row_temps = temps[short.to(temps.device)]
            row_norms, targets = log_norms[short.to(log_norms.device)], wide_mass[short]
        wide_top, wide_ids, count = wide_lists(
            logits, short, row_temps.double(), row_norms.double(), targets.double(),
            self.max_listed,
        )  # fmt: skip
        counts = count.tolist()  # [W]
        num_widened = sum(1 for n in counts if n > 0)
        self.num_widened_rows += num_widened  # not those whose best bin overflows the budget
        if not num_widened:
            return top, ids
        listed = max(counts)
        width = max(top.shape[-1], listed)
        if num_widened == top.shape[0]:  # every row widened (`short` is every row, in order)
            return wide_top[:, :width], wide_ids[:, :width]
        widened = count > 0  # [W]
        short, wide_top, wide_ids = short[widened], wide_top[widened], wide_ids[widened]
        out_top = torch.zeros(top.shape[0], width)
        out_ids = torch.zeros(top.shape[0], width, dtype=torch.long)  # padding: id 0, q 0
        out_top[:, : top.shape[-1]], out_ids[:, : top.shape[-1]] = top, ids
        out_top[short], out_ids[short] = 0.0, 0
        out_top[short, :listed] = wide_top[:, :listed]
        out_ids[short, :listed] = wide_ids[:, :listed]
        return out_top, out_ids

    def _draw_rows(
        self,
        logits: torch.Tensor,
        keys: list[RowKey],
        top: torch.Tensor,
        ids: torch.Tensor,
    ) -> list[tuple[int, SparseDraw]]:
        """q at the listed tokens top [A', S] (0: not listed) and their ids [A', S] -> (token,
        counts it was drawn from) per row."""
        draws = torch.tensor([keyed_draw(k.draft_seed, k.position, PROPOSAL_BITS) for k in keys])
        # [A', S], [A'] int64 counts and tails (rows sum to 2^15); [A'] the listed token each
        # draw picks (-1: the tail); [A', S] the listed ids with a positive count (else -1)
        counts, tails, tokens, listed = quantize_and_draw(top, ids, draws)
        return self._finish_rows(logits, keys, ids, counts, tails.tolist(), tokens.tolist(), listed)

    @staticmethod
    def _finish_rows(
        logits: torch.Tensor,
        keys: list[RowKey],
        ids: torch.Tensor,
        counts: torch.Tensor,
        tails: list[int],
        picked: list[int],
        listed: torch.Tensor,
    ) -> list[tuple[int, SparseDraw]]:
        """The rows' lists ids [A', S] and counts [A', S] int64, tail counts [A'], the listed
        token each row drew (-1: the tail) and the ids a tail draw avoids [A', S] (-1: none)
        -> (token, counts it was drawn from) per row: a tail draw's token by the Gumbel race."""
        vocab_size = logits.shape[-1]
        in_tail = [r for r, token in enumerate(picked) if token < 0]
        if in_tail:  # the Gumbel-max of q over the unlisted tokens, with the shared field
            rows = torch.tensor(in_tail)
            tail_keys = field_keys(
                [keys[r].draft_seed for r in in_tail], [keys[r].position for r in in_tail]
            )
            # argmax over U of (log q + G) = argmax over U of (logits + T G)
            temps = float32_tensor([keys[r].temperature for r in in_tail])  # [T]
            drawn = gumbel_argmax(
                logits, tail_keys, listed[rows], rows=rows, noise_scale=temps
            ).tolist()
            for r, token in zip(in_tail, drawn, strict=True):
                picked[r] = token
        out = []
        from_tail = set(in_tail)
        rows_ids, rows_counts = ids.unbind(0), counts.unbind(0)  # [S] views, one call each
        for r, (key, token, tail) in enumerate(zip(keys, picked, tails, strict=True)):
            if token < 0:  # no unlisted token has any probability: any unlisted one will do
                listed_ids = rows_ids[r][rows_counts[r] > 0].tolist()
                word = keyed_u64(key.draft_seed ^ TAIL_SALT, key.position)
                token = unlisted_token(listed_ids, vocab_size, word)
            out.append((token, SparseDraw(rows_ids[r], rows_counts[r], tail, r in from_tail)))
        return out


def _prob_of(sparse: SparseDraw, token: int) -> float:
    """q(token) under the counts it was drawn from (the tail's share if it is not listed)."""
    hits = sparse.counts[sparse.ids == token]
    if bool((hits > 0).any()):
        return float(hits.sum()) / PROPOSAL_TOTAL
    return 0.0  # a tail token: its share of the tail is negligible for planning branches
