"""The binary encoding of draft requests and replies (little-endian, struct + numpy).

Request:  "SPDQ" u8 version, u8 flags (1: reset, 2: 4-byte ids), u32 message id, then five
          sections, each a u16 count and its entries:
          releases  u16 slot
          admits    u16 slot, u64 draft seed, f64 temperature, u32 n, n ids
          updates   u16 slot, u8 branch (255: none), u8 drafts used, u16 n, n ids
          propose   u16 slot, u8 k
          prepare   (after a u8 branch budget per sequence, 0: the drafter's own) u16 slot, u8 k
Reply:    "SPDR" u8 version, u8 flags (2: 4-byte ids), u32 message id, u64 instance id,
          f32 draft time, f32 prepare time, then three sections:
          errors    i32 slot (-1: the whole message), u16 length, UTF-8 text
          proposals u16 slot, drafts
          branches  u16 slot, u8 count, per branch: u8 accepted count, id token, drafts
Drafts:   u8 n, n ids, then per draft u8 W (0: a point mass on the draft; 1..254: a sampled
          draft listing S = W - 1 tokens; 255: S follows as a u16), S ids, S u16 counts, u16
          tail count (the counts and the tail sum to exactly 2^15; the tail is the mass of the
          unlisted tokens, its token coupled by the Gumbel field; zero counts are never sent).

Ids are uint16 when every id in the message fits, else int32. Nothing in a round's messages
depends on the context length: only an admit (once per sequence, or on a resync) carries a
whole token list. A sampled draft at top-32 costs at most 2 + 1 + 32 * 4 + 2 = 133 bytes.
"""

import math

import numpy as np
import torch

from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord, PreparedBranch, SparseDraw
from daemon.runtime.remote.messages import (
    AdmitEntry,
    DraftEntry,
    DraftReply,
    DraftRequest,
    SlotBranches,
    SlotDrafts,
    SlotError,
    UpdateEntry,
)
from daemon.runtime.remote.wire_io import WireReader, WireWriter, id_width_for
from daemon.runtime.sampling.quantized import MAX_LISTED, PROPOSAL_TOTAL

# 2: sampled drafts carry a tail; 3: the tail is a class whose token drafter and verifier pick
# with a shared Gumbel field (a version-2 peer would test such drafts as if evenly spread: not
# lossless), and a draft may list up to MAX_LISTED tokens; 4: the field is drawn top down
# through superblocks (gumbel_field.py). A version-3 peer draws other noise: still lossless
# (the verifier's pick is its own draw), but its coupled drafts and tail guesses would seldom
# match, so it is refused rather than left to run slow.
VERSION = 4
WIDE_SUPPORT = 255  # the width byte that says the support size follows as a u16
REQUEST_MAGIC, REPLY_MAGIC = b"SPDQ", b"SPDR"
# FLAG_COUPLED: the request's sampled drafts go coupled. A drafter that predates it ignores it
# (unknown flags are) and lists as built: still exact, the verifier takes either form
FLAG_RESET, FLAG_WIDE_IDS, FLAG_COUPLED = 1, 2, 4
WIRE_NO_BRANCH = 0xFF
MAX_SECTION = 0xFFFF
MAX_TEMPERATURE = 100.0


# -- requests -------------------------------------------------------------------------------
def encode_request(request: DraftRequest) -> bytes:
    max_id = max(
        [max(a.token_ids, default=0) for a in request.admits]
        + [max(u.new_token_ids, default=0) for u in request.updates],
        default=0,
    )
    out = WireWriter(id_width_for(max_id))
    flags = (
        (FLAG_RESET if request.is_reset else 0)
        | (FLAG_WIDE_IDS if out.id_width == 4 else 0)
        | (FLAG_COUPLED if request.coupled else 0)
    )
    out.pack("4sBBI", REQUEST_MAGIC, VERSION, flags, request.message_id)
    _count(out, request.releases, "releases")
    for slot in request.releases:
        out.pack("H", slot)
    _count(out, request.admits, "admits")
    for admit in request.admits:
        out.pack("HQdI", admit.slot, admit.draft_seed, admit.temperature, len(admit.token_ids))
        out.ids(admit.token_ids)
    _count(out, request.updates, "updates")
    for update in request.updates:
        branch = WIRE_NO_BRANCH if update.branch == NO_BRANCH else update.branch
        out.pack("HBBH", update.slot, branch, update.num_used, len(update.new_token_ids))
        out.ids(update.new_token_ids)
    for entries, name in ((request.propose, "propose"), (request.prepare, "prepare")):
        if name == "prepare":
            out.pack("B", request.max_branches)
        _count(out, entries, name)
        for entry in entries:
            out.pack("HB", entry.slot, entry.k)
    return out.getvalue()


def decode_request(payload: bytes) -> DraftRequest:
    read = WireReader(payload, "draft request")
    flags, message_id = _header(read, REQUEST_MAGIC)
    request = DraftRequest(
        message_id=message_id,
        is_reset=bool(flags & FLAG_RESET),
        coupled=bool(flags & FLAG_COUPLED),
    )
    for _ in range(_section(read, "releases")):
        request.releases.append(int(read.one("H", "release slot")))
    for _ in range(_section(read, "admits")):
        slot, seed, temperature, num = read.unpack("HQdI", "admit entry")
        if not (math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
            raise read.error(f"admit slot {slot}: temperature {temperature} not in [0, 100]")
        ids = read.ids(num, f"admit slot {slot} token ids").tolist()
        request.admits.append(AdmitEntry(slot, ids, seed, temperature))
    for _ in range(_section(read, "updates")):
        slot, branch, num_used, num = read.unpack("HBBH", "update entry")
        ids = read.ids(num, f"update slot {slot} token ids").tolist()
        branch = NO_BRANCH if branch == WIRE_NO_BRANCH else branch
        request.updates.append(UpdateEntry(slot, ids, branch, num_used))
    for entries, name in ((request.propose, "propose"), (request.prepare, "prepare")):
        if name == "prepare":
            request.max_branches = int(read.one("B", "prepare branch budget"))
        for _ in range(_section(read, name)):
            entries.append(DraftEntry(*read.unpack("HB", f"{name} entry")))
    read.finish()
    return request


# -- replies --------------------------------------------------------------------------------
def encode_reply(reply: DraftReply) -> bytes:
    records = [p.drafts for p in reply.proposals] + [
        br.drafts for b in reply.branches for br in b.branches
    ]
    tokens = [br.token for b in reply.branches for br in b.branches]
    out = WireWriter(id_width_for(max([*tokens, *(_max_id(r) for r in records)], default=0)))
    flags = FLAG_WIDE_IDS if out.id_width == 4 else 0
    out.pack("4sBBI", REPLY_MAGIC, VERSION, flags, reply.message_id)
    out.pack("Qff", reply.instance_id, reply.draft_time_s, reply.prepare_time_s)
    _count(out, reply.errors, "errors")
    for error in reply.errors:
        out.pack("i", error.slot)
        out.text(error.message)
    _count(out, reply.proposals, "proposals")
    for proposal in reply.proposals:
        out.pack("H", proposal.slot)
        _write_drafts(out, proposal.drafts)
    _count(out, reply.branches, "branches")
    for entry in reply.branches:
        out.pack("HB", entry.slot, len(entry.branches))
        for branch in entry.branches:
            out.pack("B", branch.num_accepted)
            out.ids([branch.token])
            _write_drafts(out, branch.drafts)
    return out.getvalue()


def decode_reply(payload: bytes) -> DraftReply:
    read = WireReader(payload, "draft reply")
    _, message_id = _header(read, REPLY_MAGIC)
    instance_id, draft_s, prepare_s = read.unpack("Qff", "reply timings")
    reply = DraftReply(message_id, instance_id, draft_time_s=draft_s, prepare_time_s=prepare_s)
    for _ in range(_section(read, "errors")):
        slot = int(read.one("i", "error slot"))
        reply.errors.append(SlotError(slot, read.text("error text")))
    for _ in range(_section(read, "proposals")):
        slot = int(read.one("H", "proposal slot"))
        reply.proposals.append(SlotDrafts(slot, _read_drafts(read, f"proposal slot {slot}")))
    for _ in range(_section(read, "branches")):
        slot, num = read.unpack("HB", "branches entry")
        branches = []
        for i in range(num):
            accepted = int(read.one("B", f"slot {slot} branch {i}"))
            token = int(read.ids(1, f"slot {slot} branch {i} token")[0])
            drafts = _read_drafts(read, f"slot {slot} branch {i}")
            branches.append(PreparedBranch(accepted, token, drafts))
        reply.branches.append(SlotBranches(slot, branches))
    read.finish()
    return reply


# -- parts ----------------------------------------------------------------------------------
def _header(read: WireReader, magic: bytes) -> tuple[int, int]:
    got, version, flags, message_id = read.unpack("4sBBI", "header")
    if got != magic:
        raise read.error(f"bad magic {got!r} (expected {magic!r})")
    if version != VERSION:
        raise read.error(f"unsupported version {version} (this side speaks {VERSION})")
    read.id_width = 4 if flags & FLAG_WIDE_IDS else 2
    return flags, message_id


def _count(out: WireWriter, entries: list, name: str) -> None:
    if len(entries) > MAX_SECTION:
        raise ValueError(f"{len(entries)} {name} entries exceed {MAX_SECTION} per message")
    out.pack("H", len(entries))


def _section(read: WireReader, name: str) -> int:
    return int(read.one("H", f"{name} count"))


def _max_id(record: DraftRecord) -> int:
    sparse = [int(s.ids.max()) for s in record.sparse if s is not None and s.ids.numel()]
    return max([*record.tokens, *sparse], default=0)


def _write_drafts(out: WireWriter, record: DraftRecord) -> None:
    out.pack("B", len(record.tokens))
    out.ids(record.tokens)
    for sparse in record.sparse:
        if sparse is None:
            out.pack("B", 0)
            continue
        keep = sparse.counts > 0  # zero counts are padding: never drawn, never sent
        ids, counts = sparse.ids[keep].numpy(), sparse.counts[keep].numpy()
        if len(ids) > MAX_LISTED:
            raise ValueError(f"a draft lists {len(ids)} tokens; the wire carries {MAX_LISTED}")
        if len(ids) + 1 < WIDE_SUPPORT:
            out.pack("B", len(ids) + 1)
        else:
            out.pack("BH", WIDE_SUPPORT, len(ids))
        out.ids(ids)
        out.counts(counts)
        out.pack("H", sparse.tail)


def _read_drafts(read: WireReader, what: str) -> DraftRecord:
    num = int(read.one("B", f"{what} draft count"))
    tokens = read.ids(num, f"{what} draft ids").tolist()
    record = DraftRecord(tokens=tokens, sparse=[], alternatives=[[] for _ in tokens])
    for pos, token in enumerate(tokens):
        width = int(read.one("B", f"{what} draft {pos} support size"))
        if width == 0:
            record.sparse.append(None)
            continue
        num_listed = width - 1
        if width == WIDE_SUPPORT:
            num_listed = int(read.one("H", f"{what} draft {pos} support size"))
            if num_listed > MAX_LISTED:
                raise read.error(f"{what} draft {pos} lists {num_listed} > {MAX_LISTED} tokens")
        ids = read.ids(num_listed, f"{what} draft {pos} support ids")
        counts = read.counts(num_listed, f"{what} draft {pos} counts")
        tail = int(read.one("H", f"{what} draft {pos} tail count"))
        _check_support(read, what, pos, token, ids, counts, tail)
        record.sparse.append(SparseDraw(torch.from_numpy(ids), torch.from_numpy(counts), tail))
    return record


def _check_support(
    read: WireReader,
    what: str,
    pos: int,
    token: int,
    ids: np.ndarray,
    counts: np.ndarray,
    tail: int,
) -> None:
    """A proposal is only lossless if it is a distribution containing the draft."""
    where = f"{what} draft {pos}"
    if int(counts.sum()) + tail != PROPOSAL_TOTAL or (counts.size and int(counts.min()) <= 0):
        raise read.error(
            f"{where}: counts must be positive and sum with the tail to {PROPOSAL_TOTAL}"
        )
    if np.unique(ids).size != ids.size:
        raise read.error(f"{where}: repeated support ids")
    if token not in ids and tail == 0:
        raise read.error(f"{where}: draft token {token} is outside its proposal's support")
