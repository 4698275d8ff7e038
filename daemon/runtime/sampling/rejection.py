"""Rejection sampling for speculative decoding: the torch reference.

Leviathan et al. 2023 / Chen et al. 2023. For draft token x proposed from q at a position where
the target's distribution is p:
    accept x with probability min(1, p(x) / q(x))     (test: u * q(x) < p(x), u ~ U[0, 1))
    on the first rejection emit a sample from norm(max(0, p - q))
    if every draft is accepted emit a bonus sample from p at position num_draft.
The emitted tokens are then distributed exactly as if sampled from the target one by one.
Greedy rows accept while draft == argmax p and emit argmax p.

Proposal convention (q, per sequence b and position j):
  * draft_sparse_ids / draft_sparse_probs is None: every q is a point mass on the draft token
    (greedy draft, n-gram lookup).
  * otherwise q lists the L tokens with a non-zero prob: q(ids[b, j, s]) = probs[b, j, s]
    (their ids unique within a position), and puts the tail mass tail[b, j] on the other
    tokens, the unlisted set U, shaped like the target there: q(i) = tail * p(i) / p(U) for
    i in U (draft_sparse_tail None: no tail). Padding entries have prob 0 (any in-range id).
    The drafter cannot sample that shape (it does not know p), and need not: the accept test
    of an unlisted draft is the test of the class U (accept with min(1, p(U) / tail), the same
    for every token of U), and the token the class stands for is the verifier's own sample
    from p restricted to U, y = argmax_{i in U} (log p_i + G_i), with G the Gumbel field of
    the draft position (gumbel_field.py, keyed by `position_keys`). The drafter drew its own
    unlisted token as argmax_{i in U} (log q_i + G_i) with the same field, so the two agree
    most of the time (always when q = p on U); the draft is accepted when they do. When they
    differ, y is emitted there and the round ends: it is still exactly the token the proposal
    q would have had accepted. The residual max(0, p - q) on U is p * max(0, 1 - tail / p(U)).
    The field of a position decides a committed token only at a position the round commits;
    positions drafted past the round's stop keep noise no verdict depended on (the argument of
    keyed_random.py), so the next round may draft there again with the same field.
  * a position whose sparse probs and tail are ALL zero (or no sparse data at all) is a point
    mass on draft_token_ids[b, j]; that is how greedy and sampled drafts share one batch. In a
    sampled row such a draft is *matched*, not tested: the verifier draws its own token there,
    y = argmax_i (log p_i + G_i) with the position's field, accepts the draft when it is y and
    otherwise emits y and ends the round. Exact whatever the draft (the token committed at the
    position is y, a Gumbel-max sample of p, either way), and accepted with probability p(x)
    for a fixed x, as the test min(1, p(x) / 1) would be; but a drafter that draws x as
    argmax (log q + G) with the same field (proposals of no listed tokens, coupled drafting:
    proposers/draft_sampling.py) is accepted whenever shared noise makes q and p pick alike,
    and sends no probabilities at all. A round of such drafts commits exactly the tokens the
    target alone would sample with the same field, so speculation does not change a seeded
    request's output.
Randomness comes in as tensors (see `random.py`): `uniform[b, j]` for the accept test at
position j, and one float64 `emit_uniform[b]` for the token emitted after the accepted prefix,
drawn by the inverse CDF of its distribution (`inverse_cdf.py`): one number per sequence
whatever the vocabulary size, used once, at whichever position the sequence stops. With
`bonus_keys` (the engine's calls) a sampled row's bonus is instead the Gumbel-max of its
position's field, which the drafter can guess (coupled_bonus.py). A token settled that way, or
by a matched draft's own y, is never drawn from a residual: that is a pass over the vocabulary
per row, only for the rows that need it.
A batch of greedy rows only reads the target's argmax.
"""

from dataclasses import dataclass

import torch

from daemon.runtime.host_tensors import host_int64
from daemon.runtime.model import native
from daemon.runtime.sampling.argmax import argmax_last
from daemon.runtime.sampling.checks import check_rejection_inputs
from daemon.runtime.sampling.coupled_bonus import bonus_tokens
from daemon.runtime.sampling.gumbel_field import gumbel_argmax_at
from daemon.runtime.sampling.inverse_cdf import sample_inverse_cdf

PLACEHOLDER_TOKEN_ID = -1
MIN_MASS = 1e-30  # p(U) below this is taken as no mass at all (no division by zero)


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [B, K] int64, PLACEHOLDER_TOKEN_ID past num_draft
    num_draft_tokens: torch.Tensor,  # [B] int64 in [0, K]
    draft_sparse_ids: torch.Tensor | None,  # [B, K, S] int64
    draft_sparse_probs: torch.Tensor | None,  # [B, K, S] float32
    target_probs: torch.Tensor,  # [B, K+1, V] float32
    is_greedy: torch.Tensor,  # [B] bool
    uniform: torch.Tensor,  # [B, K] float32
    emit_uniform: torch.Tensor,  # [B] float64
    draft_sparse_tail: torch.Tensor | None = None,  # [B, K] float32
    # [B, K] int64 the Gumbel field key of every draft position: needed where a proposal has a
    # tail; with them a sampled row's point-mass drafts are matched (see above), without
    # tested as point masses
    position_keys: torch.Tensor | None = None,
    # [B] int64 the field key of each row's bonus position: a sampled row's bonus is then the
    # field's Gumbel-max of p there (coupled_bonus.py), not an inverse-CDF sample
    bonus_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns output_token_ids [B, K+1] int64 (accepted drafts, then the correction or bonus
    token, PLACEHOLDER_TOKEN_ID after) and num_output_tokens [B] int64 = accepted + 1."""
    check_rejection_inputs(
        draft_token_ids, num_draft_tokens, draft_sparse_ids, draft_sparse_probs,
        target_probs, is_greedy, uniform, emit_uniform, draft_sparse_tail, position_keys,
    )  # fmt: skip
    if draft_sparse_tail is None and draft_sparse_ids is not None:
        draft_sparse_tail = torch.zeros(draft_token_ids.shape, device=draft_token_ids.device)
    sparse = _Sparse.of(draft_sparse_ids, draft_sparse_probs, draft_sparse_tail)
    max_k = draft_token_ids.shape[1]
    # [B, K] draft ids usable as indices (placeholders point at token 0, never read)
    drafts = draft_token_ids.clamp(min=0)
    # [B, K]
    is_real = torch.arange(max_k, device=drafts.device) < num_draft_tokens.unsqueeze(-1)
    # [B, K+1] the argmax is a pass over every row: only when a greedy row reads it
    any_greedy = bool(is_greedy.any())
    target_argmax = argmax_last(target_probs) if any_greedy else None
    if target_argmax is not None and bool(is_greedy.all()):
        return _greedy(draft_token_ids, is_real, target_argmax)
    # [B, K] q and p of each draft (an unlisted draft is tested as its class U: p(U) against
    # the tail), where it is unlisted under a tail, and where its proposal is a point mass
    stats = _native_listed_stats(drafts, sparse, target_probs, is_greedy)
    if stats is not None:
        q_draft, p_draft, is_tail, is_point = stats
        is_tail = is_tail if bool(is_tail.any()) else None
    else:
        is_point = None
        p_draft = target_probs[:, :max_k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        q_draft, is_tail = _proposal_prob_of_draft(drafts, sparse, is_greedy)
        if is_tail is not None:
            assert sparse is not None
            p_draft = torch.where(is_tail, _unlisted_mass(target_probs[:, :max_k], sparse), p_draft)
    # u * q(x) < p(x)  <=>  u < p(x) / q(x): accept with prob min(1, p/q); q <= p always accepts
    # and p(x) == 0 never does.
    accept = uniform * q_draft < p_draft
    if target_argmax is not None:
        accept_greedy = draft_token_ids == target_argmax[:, :max_k]
        accept = torch.where(is_greedy.unsqueeze(-1), accept_greedy, accept)
    accept &= is_real
    # [B, K] the verifier's own token where a draft is matched rather than tested, else -1
    coupled = None
    if position_keys is not None:  # without keys such drafts are tested as point masses
        if is_point is not None:  # matched_drafts, from the stats
            is_matched = is_point & is_real & ~is_greedy.unsqueeze(-1)
        else:
            is_matched = matched_drafts(
                num_draft_tokens,
                None if sparse is None else sparse.probs,
                None if sparse is None else sparse.tail,
                is_greedy,
                max_k,
            )
        coupled = _matched_tokens(is_matched, target_probs, position_keys)
    if coupled is not None:
        accept = torch.where(coupled >= 0, coupled == drafts, accept)
    if is_tail is not None:
        assert sparse is not None
        in_tail = _coupled_tokens(accept, is_tail, sparse, target_probs, position_keys)
        accept &= ~is_tail | (in_tail == drafts)
        coupled = in_tail if coupled is None else torch.where(is_tail, in_tail, coupled)
    # [B] length of the accepted prefix, in [0, num_draft]
    num_accepted = accept.long().cumprod(dim=-1).sum(dim=-1)

    # [B] a token decided without the residual, -1 elsewhere: the verifier's own y where the
    # round stopped at a matched draft or at an accepted class U whose token differs; the
    # coupled bonus where a sampled row accepted every draft
    settled = torch.full_like(num_accepted, -1)
    if coupled is not None:
        at = num_accepted.clamp(max=max_k - 1).unsqueeze(-1)  # [B, 1]
        forced = coupled.gather(1, at).squeeze(1)  # [B]
        settled = torch.where(num_accepted < num_draft_tokens, forced, settled)
    if bonus_keys is not None:
        bonus = bonus_tokens(num_accepted, num_draft_tokens, target_probs, is_greedy, bonus_keys)
        settled = torch.where(bonus >= 0, bonus, settled)
    token = _emitted_token(
        drafts, num_draft_tokens, num_accepted, sparse, target_probs, target_argmax,
        is_greedy, emit_uniform, settled,
    )  # fmt: skip
    return _assemble(draft_token_ids, num_accepted, token)


def matched_drafts(
    num_draft_tokens: torch.Tensor,  # [B] int64
    sparse_probs: torch.Tensor | None,  # [B, K, S]
    sparse_tail: torch.Tensor | None,  # [B, K]
    is_greedy: torch.Tensor,  # [B] bool
    max_k: int,
) -> torch.Tensor:
    """[B, K] bool: the real drafts of sampled rows that are point masses (all-zero sparse
    probs and tail, or no sparse data): matched against the verifier's own draw when the
    position keys are given (see above)."""
    device = num_draft_tokens.device
    is_real = torch.arange(max_k, device=device) < num_draft_tokens.unsqueeze(-1)
    is_point = is_real & ~is_greedy.to(device).unsqueeze(-1)
    if sparse_probs is not None:
        is_point &= (sparse_probs == 0).all(dim=-1)
    if sparse_tail is not None:
        is_point &= sparse_tail == 0
    return is_point


def _matched_tokens(
    is_matched: torch.Tensor,  # [B, K] bool (matched_drafts)
    target_probs: torch.Tensor,  # [B, K+1, V]
    position_keys: torch.Tensor,  # [B, K]
) -> torch.Tensor | None:
    """[B, K] the verifier's Gumbel-max token of p at every matched draft, -1 elsewhere;
    None when there is none."""
    rows, positions = is_matched.nonzero(as_tuple=True)  # [E]
    if not rows.numel():
        return None
    matched = torch.full(is_matched.shape, -1, dtype=torch.long, device=is_matched.device)
    matched[rows, positions] = gumbel_argmax_at(
        target_probs, rows, positions, position_keys[rows, positions], are_probs=True
    )
    return matched


def _unlisted_mass(
    target_probs: torch.Tensor,  # [B, K, V] the target at the draft positions
    sparse: "_Sparse",
) -> torch.Tensor:
    """p(U) [B, K]: the target's mass outside each position's listed tokens."""
    listed = sparse.probs > 0  # [B, K, S] (listed ids are unique)
    p_listed = torch.where(listed, target_probs.gather(-1, sparse.ids), 0.0).sum(dim=-1)
    return (1.0 - p_listed).clamp(min=0.0)


def _coupled_tokens(
    accept: torch.Tensor,  # [B, K] the accept tests so far (an unlisted draft: its class)
    is_tail: torch.Tensor,  # [B, K] the draft is unlisted under a non-zero tail
    sparse: "_Sparse",
    target_probs: torch.Tensor,  # [B, K+1, V]
    position_keys: torch.Tensor | None,  # [B, K]
) -> torch.Tensor:
    """[B, K] the verifier's sample from p restricted to U, argmax_{i in U} (log p_i + G_i),
    at each unlisted draft whose class and every earlier draft passed (the only positions
    where it can matter); -1 elsewhere."""
    if position_keys is None:
        raise ValueError("position_keys are needed where a proposal has a non-zero tail")
    reached = accept.long().cumprod(dim=-1).bool() & is_tail  # [B, K]
    coupled = torch.full(accept.shape, -1, dtype=torch.long, device=accept.device)
    rows, positions = reached.nonzero(as_tuple=True)  # [E]
    if rows.numel():
        listed = sparse.probs[rows, positions] > 0  # [E, S]
        excluded = torch.where(listed, sparse.ids[rows, positions], -1)
        coupled[rows, positions] = gumbel_argmax_at(
            target_probs, rows, positions, position_keys[rows, positions], excluded,
            are_probs=True,
        )  # fmt: skip
    return coupled


def _greedy(
    draft_token_ids: torch.Tensor,  # [B, K]
    is_real: torch.Tensor,  # [B, K] bool
    target_argmax: torch.Tensor,  # [B, K+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """An all-greedy batch: accept while draft == argmax, then emit the argmax there."""
    max_k = draft_token_ids.shape[1]
    accept = (draft_token_ids == target_argmax[:, :max_k]) & is_real  # [B, K]
    num_accepted = accept.long().cumprod(dim=-1).sum(dim=-1)  # [B]
    token = target_argmax.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)  # [B]
    return _assemble(draft_token_ids, num_accepted, token)


def _assemble(
    draft_token_ids: torch.Tensor,  # [B, K]
    num_accepted: torch.Tensor,  # [B]
    token: torch.Tensor,  # [B] the correction or bonus
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K+1] accepted drafts, the emitted token at num_accepted, placeholders after."""
    num_seqs, max_k = draft_token_ids.shape
    device = draft_token_ids.device
    positions = torch.arange(max_k + 1, device=device)
    output = torch.full((num_seqs, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
    output = output.to(device)
    output[:, :max_k] = torch.where(
        positions[:max_k] < num_accepted.unsqueeze(-1), draft_token_ids, PLACEHOLDER_TOKEN_ID
    )
    output.scatter_(1, num_accepted.unsqueeze(-1), token.unsqueeze(-1))
    return output, num_accepted + 1


@dataclass(slots=True)
class _Sparse:
    ids: torch.Tensor  # [B, K, S] int64
    probs: torch.Tensor  # [B, K, S] float32
    tail: torch.Tensor  # [B, K] float32

    @staticmethod
    def of(
        ids: torch.Tensor | None, probs: torch.Tensor | None, tail: torch.Tensor | None
    ) -> "_Sparse | None":
        if ids is None or probs is None or tail is None:
            return None
        return _Sparse(ids, probs.float(), tail.float())


def _native_listed_stats(
    drafts: torch.Tensor,  # [B, K] >= 0
    sparse: "_Sparse | None",
    target_probs: torch.Tensor,  # [B, K+1, V]
    is_greedy: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q_draft [B, K] float32, p_draft [B, K] float32, is_tail [B, K] bool, is_point [B, K]
    bool) in one C pass over the listed entries, on a CPU with the native kernels: what
    _proposal_prob_of_draft, _unlisted_mass and matched_drafts' point-mass test give, with
    the target's mass on the listed ids summed in doubles (torch's float32 sum can differ in
    its last bit, which decides an accept test only where the uniform falls within it). None
    where it does not apply: the ops above run."""
    if sparse is None or target_probs.dim() != 3 or target_probs.stride(-1) != 1:
        return None
    module = native.for_rows(target_probs[:, 0])
    if module is None or sparse.ids.device.type != "cpu" or drafts.device.type != "cpu":
        return None
    num_seqs, max_k = drafts.shape
    ids, drafts = host_int64(sparse.ids), host_int64(drafts)  # (int32 ids pass the checks too)
    probs, tail = (t.float().contiguous() for t in (sparse.probs, sparse.tail))
    greedy = is_greedy.to(torch.uint8).contiguous()
    q = torch.empty(num_seqs, max_k)
    p = torch.empty(num_seqs, max_k)
    is_tail = torch.empty(num_seqs, max_k, dtype=torch.bool)
    is_point = torch.empty(num_seqs, max_k, dtype=torch.bool)
    module.listed_stats(
        ids.data_ptr(), probs.data_ptr(), tail.data_ptr(), ids.shape[-1], drafts.data_ptr(),
        num_seqs, max_k, target_probs.data_ptr(), target_probs.stride(0),
        target_probs.stride(1), greedy.data_ptr(), q.data_ptr(), p.data_ptr(),
        is_tail.data_ptr(), is_point.data_ptr(), target_probs.shape[-1],
    )  # fmt: skip
    return q, p, is_tail, is_point


def _proposal_prob_of_draft(
    drafts: torch.Tensor,  # [B, K]
    sparse: _Sparse | None,
    is_greedy: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q(x) [B, K] for each draft token x, and where x is unlisted under a non-zero tail
    (then q is the tail: the mass of its class U), or None if no draft is."""
    if sparse is None:
        return torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device), None
    # [B, K, S] the entry listing x (at most one has a non-zero prob)
    hit = (sparse.ids == drafts.unsqueeze(-1)) & (sparse.probs > 0)
    listed = torch.where(hit, sparse.probs, 0.0).sum(dim=-1)  # [B, K]
    is_listed = hit.any(dim=-1)
    q = torch.where(is_listed, listed, sparse.tail)
    # all-zero sparse probs and tail: point mass on the draft token
    is_point_mass = (sparse.probs == 0).all(dim=-1) & (sparse.tail == 0)
    is_tail = ~is_listed & (sparse.tail > 0) & ~is_greedy.unsqueeze(-1)
    return torch.where(is_point_mass, 1.0, q), is_tail if bool(is_tail.any()) else None


def _emitted_token(
    drafts: torch.Tensor,  # [B, K]
    num_draft: torch.Tensor,  # [B]
    num_accepted: torch.Tensor,  # [B]
    sparse: _Sparse | None,
    target_probs: torch.Tensor,  # [B, K+1, V]
    target_argmax: torch.Tensor | None,  # [B, K+1]; None: no greedy row
    is_greedy: torch.Tensor,  # [B]
    emit_uniform: torch.Tensor,  # [B] float64
    settled: torch.Tensor,  # [B] the token where it is already decided, else -1
) -> torch.Tensor:
    """The correction (first rejection) or bonus (all accepted) token [B] at num_accepted.
    The residual is built and sampled only for the sampled rows whose token is not settled:
    each is a pass over the vocabulary."""
    token = settled.clone()
    if target_argmax is not None:  # greedy rows emit the argmax
        greedy = target_argmax.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)
        token = torch.where(is_greedy, greedy, token)
    rows = ((settled < 0) & ~is_greedy).nonzero().flatten()  # [E]
    if not rows.numel():
        return token
    at = num_accepted[rows]  # [E]
    found = _native_residual_tokens(target_probs, rows, at, num_draft, drafts, sparse, emit_uniform)
    if found is not None:
        token[rows] = found
        return token
    # [E, V] the target's distribution at each row's emit position (a copy: ours to overwrite)
    p = target_probs[rows, at]
    # rejected: sample norm(max(0, p - q)); bonus: q == 0 there, so this is p itself.
    residual = _residual_in_place(p, drafts[rows], num_draft[rows], at, _rows_of(sparse, rows))
    # p == q leaves nothing: fall back to p (cannot happen when x ~ q, kept for safety)
    is_empty = residual.amax(dim=-1) <= 0  # [E]
    if bool(is_empty.any()):
        residual[is_empty] = target_probs[rows[is_empty], at[is_empty]]
    token[rows] = sample_inverse_cdf(residual, emit_uniform[rows])
    return token


def _native_residual_tokens(
    target_probs: torch.Tensor,  # [B, K+1, V]
    rows: torch.Tensor,  # [E] the sequences to sample
    at: torch.Tensor,  # [E] their emit positions (num_accepted)
    num_draft: torch.Tensor,  # [B]
    drafts: torch.Tensor,  # [B, K] >= 0
    sparse: _Sparse | None,
    emit_uniform: torch.Tensor,  # [B] float64
) -> torch.Tensor | None:
    """The tokens [E] int64 _emitted_token samples for `rows`, in one C call on a CPU with the
    native kernels: each row's residual written once into a scratch row (not a copy of
    [E, V] and ~20 ops over it) and sampled by inverse CDF with block sums in doubles.
    torch's block sums are float32, which moves the CDF's boundaries by up to ~1e-8: the two
    paths draw different tokens when a uniform falls between a boundary's two places, about
    once in 10^4 draws at a few thousand tokens (both exact samples up to that rounding).
    p(U) is summed in doubles as in _native_listed_stats. None where it does not apply."""
    if target_probs.dim() != 3 or target_probs.stride(-1) != 1:
        return None
    module = native.for_rows(target_probs[:, 0])
    if module is None or emit_uniform.dtype != torch.float64:
        return None
    host = (rows, at, num_draft, drafts, emit_uniform)
    if any(t.device.type != "cpu" for t in host):
        return None
    rows, at, num_draft, drafts = (host_int64(t) for t in (rows, at, num_draft, drafts))
    uniform = emit_uniform.contiguous()
    ids = probs = tails = None
    if sparse is not None:
        if sparse.ids.device.type != "cpu" or sparse.ids.shape[-1] == 0:
            return None  # (no entries: a null address, which the C call reads as no lists)
        ids = host_int64(sparse.ids)  # (int32 ids pass the checks too)
        probs, tails = (t.float().contiguous() for t in (sparse.probs, sparse.tail))
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    module.residual_sample(
        target_probs.data_ptr(), target_probs.stride(0), target_probs.stride(1),
        target_probs.shape[-1], rows.data_ptr(), at.data_ptr(), rows.shape[0],
        num_draft.data_ptr(), drafts.data_ptr(), drafts.shape[1],
        0 if ids is None else ids.data_ptr(), 0 if probs is None else probs.data_ptr(),
        0 if tails is None else tails.data_ptr(), 0 if ids is None else ids.shape[-1],
        uniform.data_ptr(), out.data_ptr(),
    )  # fmt: skip
    return out


def _rows_of(sparse: _Sparse | None, rows: torch.Tensor) -> _Sparse | None:
    if sparse is None:
        return None
    return _Sparse(sparse.ids[rows], sparse.probs[rows], sparse.tail[rows])


def _residual_in_place(
    p: torch.Tensor,  # [B, V] the target's distribution at each row's `position`, overwritten
    drafts: torch.Tensor,  # [B, K]
    num_draft: torch.Tensor,  # [B]
    position: torch.Tensor,  # [B]
    sparse: _Sparse | None,
) -> torch.Tensor:
    """max(0, p - q) [B, V] with q the proposal at each row's `position` (all zero where
    position == num_draft: the bonus), without building q densely: on the unlisted tokens q is
    p scaled by tail / p(U), so the whole row takes one multiply and only the S listed tokens
    and the draft token are fixed up."""
    max_k = drafts.shape[1]
    if max_k == 0:
        return p
    # [B] a draft position exists (rejection) rather than the bonus slot
    has_draft = position < num_draft
    at = position.clamp(max=max_k - 1).unsqueeze(-1)  # [B, 1]
    # [B] point-mass weight on the draft token: 1 without sparse data or with all-zero probs
    point_mass = has_draft.float()
    if sparse is not None:
        num_sparse = sparse.ids.shape[-1]
        at_sparse = at.unsqueeze(-1).expand(-1, 1, num_sparse)  # [B, 1, S]
        # [B, S]
        ids = sparse.ids.gather(1, at_sparse).squeeze(1)
        probs = sparse.probs.gather(1, at_sparse).squeeze(1)
        probs = torch.where(has_draft.unsqueeze(-1), probs, 0.0)
        tail = torch.where(has_draft, sparse.tail.gather(1, at).squeeze(1), 0.0)  # [B]
        p_at_ids = p.gather(1, ids)  # [B, S] before the rows change
        # every token as if unlisted: q = tail * p / p(U) there, so p - q = p * (1 - tail /
        # p(U)); then the listed ones
        p_unlisted = (1.0 - torch.where(probs > 0, p_at_ids, 0.0).sum(dim=-1)).clamp(min=0.0)
        keep = torch.where(
            tail > 0, (1.0 - tail / p_unlisted.clamp(min=MIN_MASS)).clamp(min=0.0), 1.0
        )  # [B]
        p.mul_(keep.unsqueeze(-1))
        # the listed tokens (unique ids; padding entries, prob 0, are not written: one that
        # repeats a listed id must not overwrite its value): max(0, p - q) there
        rows, entries = (probs > 0).nonzero(as_tuple=True)  # [L]
        listed_value = (p_at_ids[rows, entries] - probs[rows, entries]).clamp(min=0.0)
        p[rows, ids[rows, entries]] = listed_value
        point_mass = torch.where((probs == 0).all(dim=-1) & (tail == 0), point_mass, 0.0)
    # the draft token of a point-mass proposal: max(0, p(x) - 1)
    draft = drafts.gather(1, at)  # [B, 1]
    p.scatter_(1, draft, (p.gather(1, draft) - point_mass.unsqueeze(-1)).clamp(min=0.0))
    return p
