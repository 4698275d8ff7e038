"""Bytes per round per sequence, computed by encoding the messages of a round.

A round in sync mode, per sequence: the verifier's update (the tokens committed since the last
round: at most k + 1, all drafts accepted plus the bonus token) and propose entry, and the
drafter's reply (k drafts; sampled ones with their counts). In overlapped mode a hit replaces
the propose call by the prepare request, and the drafter's branches reply carries
`num_branches` branches of k drafts each. Admits (once per sequence) are not part of a round.
The messages hold no position and no context: the size does not depend on context length,
which `context_len` lets a test show.
"""

import torch

from daemon.runtime.proposers.drafts import DraftRecord, PreparedBranch, SparseDraw
from daemon.runtime.remote.messages import (
    DraftEntry,
    DraftReply,
    DraftRequest,
    SlotBranches,
    SlotDrafts,
    UpdateEntry,
)
from daemon.runtime.remote.wire import encode_reply, encode_request
from daemon.runtime.sampling.quantized import PROPOSAL_TOTAL

NUM_SEQS = 8  # header bytes are shared by the batch


def bytes_per_round_per_seq(
    *,
    context_len: int,
    k: int,
    sparse_top_k: int,
    sampled: bool,
    num_branches: int = 0,
    vocab_size: int = 4096,
) -> float:
    """Request + reply bytes of one round, per sequence (num_branches 0: sync mode; else the
    overlapped round on a hit, with that many prepared branches per sequence)."""
    gen = torch.Generator().manual_seed(0)
    contexts = [torch.randint(vocab_size, (context_len + k + 1,), generator=gen).tolist()] * (
        NUM_SEQS
    )
    request = DraftRequest(message_id=1)
    reply = DraftReply(message_id=1, instance_id=1)
    for slot, tokens in enumerate(contexts):
        request.updates.append(UpdateEntry(slot, tokens[context_len:], 0 if num_branches else -1))
        drafts = _drafts(tokens[:k], sparse_top_k if sampled else 0, vocab_size)
        if num_branches:
            request.prepare.append(DraftEntry(slot, k))
            branches = [PreparedBranch(k, tokens[0], drafts) for _ in range(num_branches)]
            reply.branches.append(SlotBranches(slot, branches))
        else:
            request.propose.append(DraftEntry(slot, k))
            reply.proposals.append(SlotDrafts(slot, drafts))
    return (len(encode_request(request)) + len(encode_reply(reply))) / NUM_SEQS


def _drafts(tokens: list[int], width: int, vocab_size: int) -> DraftRecord:
    """Drafts whose supports are `width` distinct tokens with non-zero counts (the largest
    a top-`width` proposal gets on the wire); width 0: greedy (ids only)."""
    record = DraftRecord()
    for token in tokens:
        sparse = None
        if width:
            others = [t for t in range(width + 1) if t != token][: width - 1]
            ids = torch.tensor([token, *others])
            counts = torch.full((width,), PROPOSAL_TOTAL // width)
            counts[0] += PROPOSAL_TOTAL - int(counts.sum())
            sparse = SparseDraw(ids, counts)
        record.append(token, sparse, [])
    return record
