"""What a sampled draft's compact proposal costs in acceptance, measured without sampling noise.

    python -m bench.proposal_acceptance [--temperature 1.0] [--tokens 128] [--prompts 16]
        [--formats 32,256:0.95,1024,learned]

The engine's acceptance rate moves by several percent between runs of one proposal format:
each format's drafts send the sampled text down a different path, and each accept test is a
coin flip. This bench compares formats on the same contexts, exactly. The target samples a
continuation of each prompt at the temperature (the text speculation verifies); at every
sampled position it takes the target's distribution p and the draft's q (both at that
temperature) and computes each format's probability that a draft drawn there is accepted:

  * full-distribution drafting (q sent whole): sum_x min(p(x), q(x));
  * a listed proposal (format `S` or `S:m`: the draft's best S tokens, no more than it takes
    to cover mass m, rounded to counts out of 2^15, and the tail; proposers/draft_sampling.py):
    sum over the listed tokens L of min(p(x), q'(x)) with q' the counts' probabilities, plus
    min(q'(U), p(U)) * P(the two Gumbel races over the unlisted tokens U pick the same token)
    (the tail's test, sampling/rejection.py). That agreement has a closed form
    (`coupling_agreement`), so no draw enters the figure;
  * `learned`: what the engine's default drafter lists on these positions once it has learned
    how often its tail drafts are accepted (`learned_format`, proposers/tail_verdicts.py).

Per format the table shows that probability's mean over positions, and the acceptance rate a
round of k = 4 drafts would get (what the engine reports: accepted drafts / drafts; the round
starting at position t accepts i drafts with probability a_t ... a_{t+i-1} (1 - a_{t+i}), the
drafts following the target's text while accepted). A per-draft loss compounds along a round,
so the rate's loss is about twice the per-draft one. The rate's ratio to full drafting is the
issue's "within 2%" target. Beside it: the tokens listed per draft and the bytes a round of
k = 4 such drafts takes per sequence on the drafter's wire (remote/wire_budget.py).
"""

import argparse
from dataclasses import dataclass

import torch
from rich.table import Table

from bench.workload import load_prompt_texts, tokenize
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.proposers.tail_verdicts import SUGGESTED_MAX_LISTED, TAIL_LOSS
from daemon.runtime.remote.wire_budget import bytes_per_round_per_seq
from daemon.runtime.sampling.quantized import MAX_LISTED, PROPOSAL_TOTAL, quantize_with_tail
from specctl.console import make_console
from specctl.demo_pair import DEMO_PROMPTS_CODE, DEMO_PROMPTS_PROSE, require_demo_pair

K = 4  # drafts per round in the rate and bytes columns
DEFAULT_PROPOSAL = EngineConfig().draft_sparse_top_k  # the engine's default base list


def coupling_agreement(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """p, q [R, V] non-negative weights (each row normalised here; a row may sum to 0) ->
    [R] P(argmax_i (log p_i + G_i) = argmax_i (log q_i + G_i)), G i.i.d. Gumbel.

    Both races pick i when every other E_j / p_j and E_j / q_j exceed E_i / p_i and
    E_i / q_i (the exponential-race form, E ~ Exp(1)), so the probability is
    sum_i 1 / sum_j max(p_j / p_i, q_j / q_i). With r = p / q, the inner sum is
    P(r >= r_i) / p_i + Q(r < r_i) / q_i: one sort by r and two prefix sums per row."""
    p = p.double() / p.double().sum(-1, keepdim=True).clamp(min=1e-300)  # [R, V]
    q = q.double() / q.double().sum(-1, keepdim=True).clamp(min=1e-300)
    both = (p > 0) & (q > 0)  # only a token both can pick adds to the agreement
    ratio = torch.where(both, p / q.clamp(min=1e-300), torch.where(p > 0, torch.inf, 0.0))
    order = torch.argsort(ratio, dim=-1, descending=True, stable=True)  # [R, V]
    p_sorted, q_sorted, both_sorted = (
        p.gather(-1, order),
        q.gather(-1, order),
        both.gather(-1, order),
    )
    # descending ratio: P(r >= r_i) = p's prefix up to and including i; Q(r < r_i) = q's
    # mass after i (ties: counted in P, which the max makes exact for equal ratios)
    p_at_or_above = p_sorted.cumsum(-1)
    q_below = q_sorted.sum(-1, keepdim=True) - q_sorted.cumsum(-1)
    denom = p_at_or_above / p_sorted.clamp(min=1e-300) + q_below / q_sorted.clamp(min=1e-300)
    return torch.where(both_sorted, 1.0 / denom, 0.0).sum(-1)


@dataclass(frozen=True, slots=True)
class ProposalFormat:
    width: int  # tokens listed at most (0: the whole vocabulary, full-distribution drafting)
    mass: float = 1.0  # list no more than it takes to cover this much of q
    # a row whose best `width` tokens cover less than widen_mass lists its best up to
    # widen_to tokens instead, no more than it takes to cover widen_mass (0: never)
    widen_to: int = 0
    widen_mass: float = 0.0

    @property
    def label(self) -> str:
        if self.width == 0:
            return "full distribution"
        label = f"top-{self.width}" + (f", mass {self.mass:g}" if self.mass < 1.0 else "")
        if self.widen_to:
            label += f"; to {self.widen_to} for mass {self.widen_mass:.4f}"
        return label


def learned_format(
    p: torch.Tensor, q: torch.Tensor, width: int = DEFAULT_PROPOSAL
) -> ProposalFormat:
    """What a drafter with proposal_max_tokens = SUGGESTED_MAX_LISTED learns to list here
    (proposers/tail_verdicts.py): its tail drafts' acceptance a at the base width, from the
    exact per-position figures, gives the listing mass 1 - TAIL_LOSS / (1 - a); rows short of
    it widen up to SUGGESTED_MAX_LISTED. (The engine cuts at bins of log q; this cut is exact.)"""
    _, _, tail_q, tail_accept = _acceptance_parts(p, q, ProposalFormat(width))
    acceptance = float(tail_accept.sum() / tail_q.sum().clamp(min=1e-300))
    mass = max(0.0, 1.0 - TAIL_LOSS / max(1.0 - acceptance, 1e-9))
    return ProposalFormat(width, widen_to=SUGGESTED_MAX_LISTED, widen_mass=mass)


def parse_formats(text: str) -> list[ProposalFormat | None]:
    """'32,256:0.95,learned' -> formats (width[:mass]; "learned": what a widening drafter
    lists, see learned_format, left None here); the full distribution is always compared."""
    formats: list[ProposalFormat | None] = []
    for part in text.split(","):
        if part.strip() == "learned":
            formats.append(None)
            continue
        width, _, mass = part.strip().partition(":")
        try:
            fmt = ProposalFormat(int(width), float(mass) if mass else 1.0)
        except ValueError as error:
            raise SystemExit(f"--formats: {part!r} is not WIDTH or WIDTH:MASS ({error})") from None
        if fmt.width < 1 or not 0.0 < fmt.mass <= 1.0:
            raise SystemExit(f"--formats: {part!r} needs WIDTH >= 1 and MASS in (0, 1]")
        formats.append(fmt)
    return formats


def proposal_acceptance(
    p: torch.Tensor, q: torch.Tensor, fmt: ProposalFormat
) -> tuple[torch.Tensor, torch.Tensor]:
    """p, q [R, V] probabilities of the target and the draft at R positions -> ([R] the
    probability that a draft from the format's proposal is accepted, [R] tokens listed)."""
    if fmt.width == 0:
        full = torch.minimum(p.double(), q.double()).sum(-1)
        return full, torch.full_like(full, float(q.shape[-1]))
    accept, listed, _, _ = _acceptance_parts(p, q, ProposalFormat(fmt.width, fmt.mass))
    if fmt.widen_to:
        short = q.topk(min(fmt.width, q.shape[-1]), dim=-1).values.sum(-1) < fmt.widen_mass
        wide = ProposalFormat(fmt.widen_to, min(fmt.mass, fmt.widen_mass))
        wide_accept, wide_listed, _, _ = _acceptance_parts(p, q, wide)
        accept = torch.where(short, wide_accept, accept)
        listed = torch.where(short, wide_listed, listed)
    return accept, listed


def _acceptance_parts(
    p: torch.Tensor, q: torch.Tensor, fmt: ProposalFormat
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> [R] P(accept), [R] tokens listed, [R] the tail's mass and [R] P(a tail draft is
    drawn and accepted), for a listed proposal (top `width`, cut at `mass`)."""
    top, ids = q.topk(min(fmt.width, q.shape[-1]), dim=-1)  # [R, S] best first, as drafted
    if fmt.mass < 1.0:
        top = torch.where(top.cumsum(dim=-1) - top < fmt.mass, top, 0.0)
    counts, tails = quantize_with_tail(top)  # [R, S], [R]
    listed_q = counts.double() / PROPOSAL_TOTAL  # [R, S] q' on the listed tokens
    listed = counts > 0
    p_listed = p.double().gather(-1, ids)  # [R, S]
    accept_listed = torch.where(listed, torch.minimum(p_listed, listed_q), 0.0).sum(-1)
    in_tail = torch.ones_like(p, dtype=torch.bool).scatter_(-1, ids, ~listed)  # [R, V] U
    p_tail = torch.where(in_tail, p.double(), 0.0)
    q_tail = torch.where(in_tail, q.double(), 0.0)
    tail_q = tails.double() / PROPOSAL_TOTAL
    accept_tail = torch.minimum(tail_q, p_tail.sum(-1)) * coupling_agreement(p_tail, q_tail)
    return accept_listed + accept_tail, listed.sum(-1).double(), tail_q, accept_tail


def round_acceptance_rate(accept: torch.Tensor, run_length: int, k: int = K) -> float:
    """accept [R] per-position acceptance probabilities, runs of `run_length` consecutive
    positions (one per prompt) -> the expected accepted drafts / k of a round of k drafts,
    averaged over the rounds that fit inside a run."""
    runs = accept.double().view(-1, run_length)  # [P, L]
    if run_length < k:
        raise ValueError(f"runs of {run_length} positions cannot hold a round of {k} drafts")
    starts = run_length - k + 1
    # [P, starts, k] a round's per-draft probabilities; the prefix products are P(>= i accepted)
    windows = torch.stack([runs[:, i : i + starts] for i in range(k)], dim=-1)
    return float(windows.cumprod(dim=-1).sum(dim=-1).mean() / k)


def sampled_positions(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: list[list[int]],
    new_tokens: int,
    temperature: float,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target samples `new_tokens` after each prompt -> (p, q) [R, V] at every sampled
    position, both at `temperature`."""
    generator = torch.Generator().manual_seed(seed)
    ps, qs = [], []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])  # [1, L]
            for _ in range(new_tokens):  # no KV cache: the models are tiny, the text short
                logits = target(ids).logits[0, -1].float()  # [V]
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)
                ids = torch.cat([ids, token.view(1, 1)], dim=-1)
            sampled = slice(len(prompt) - 1, ids.shape[-1] - 1)  # positions that predicted them
            ps.append(torch.softmax(target(ids).logits[0, sampled].float() / temperature, -1))
            qs.append(torch.softmax(draft(ids).logits[0, sampled].float() / temperature, -1))
    return torch.cat(ps), torch.cat(qs)  # [R, V]


def results_table(
    title: str,
    rows: list[tuple[ProposalFormat, float, float, float]],
    vocab_size: int,
) -> Table:
    """rows: (format, tokens listed per draft, P(accept) per draft, rate at k), full first."""
    table = Table(title=title)
    for column in (
        "proposal",
        "listed / draft",
        f"bytes / round / seq (k={K})",
        "P(accept) / draft",
        "/ full",
        f"acceptance rate (k={K})",
        "/ full",
    ):
        table.add_column(column, justify="right")
    _, _, full, full_rate = rows[0]
    for fmt, listed, accept, rate in rows:
        width = round(listed)
        wire = "local only"  # the wire lists at most MAX_LISTED tokens per draft
        if fmt.width and width <= MAX_LISTED:
            size = bytes_per_round_per_seq(
                context_len=64, k=K, sparse_top_k=width, sampled=True, vocab_size=vocab_size
            )
            wire = f"{size:,.0f}"
        table.add_row(
            fmt.label,
            f"{listed:.0f}",
            wire,
            f"{accept:.4f}",
            f"{accept / full:.4f}",
            f"{rate:.4f}",
            f"{rate / full_rate:.4f}",
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.proposal_acceptance", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=128, help="sampled tokens per prompt")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per set (at most)")
    parser.add_argument("--formats", default="32,256,1024,2048,learned")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.prompts < 1:
        raise SystemExit("--prompts must be >= 1")
    if args.tokens < K:
        raise SystemExit(f"--tokens must be >= {K} (a round of k = {K} drafts)")
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0 (greedy drafts are point masses)")
    formats = parse_formats(args.formats)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: after the arguments

    torch.set_num_threads(1)
    target_dir, draft_dir = require_demo_pair()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    console = make_console()
    for name, path in (("code", DEMO_PROMPTS_CODE), ("prose", DEMO_PROMPTS_PROSE)):
        prompts = tokenize(tokenizer, load_prompt_texts(path))[: args.prompts]
        p, q = sampled_positions(target, draft, prompts, args.tokens, args.temperature, args.seed)
        rows = []
        for given in [ProposalFormat(0), *formats]:
            fmt = given if given is not None else learned_format(p, q)
            accept, listed = proposal_acceptance(p, q, fmt)
            rate = round_acceptance_rate(accept, args.tokens)
            rows.append((fmt, float(listed.mean()), float(accept.mean()), rate))
        title = (
            f"demo pair, {name} prompts, T = {args.temperature:g}: {p.shape[0]} sampled positions"
        )
        console.print(results_table(title, rows, q.shape[-1]))


if __name__ == "__main__":
    main()
