"""Decode and verify passes at static shapes, replayed from CUDA graphs on a GPU.

Why: at a few tokens per sequence a GPU pass is bound by launching its hundreds of small
kernels, not by computing them. vLLM and SGLang capture each decode shape once as a CUDA
graph and replay it with one launch; this module does the same for the lean runner.

A graph replays fixed shapes and fixed memory, so a pass must not depend on host work:
- the batch is padded up to a power of two; a padding row repeats the last real row (same
  slot, tokens and positions), so it writes the same K/V values to the same places and its
  output is dropped;
- every row appends T tokens (a decode step T = 1, a verify pass of k drafts T = k + 1): a
  shorter chunk (a row drafting fewer tokens, a drafter's catch-up step) is padded with
  repeats of its last token at the following positions. Their K/V land past the end of the
  slot's sequence, where nothing is read before it is written again (the invariant that
  makes a rollback a change of length); their outputs are dropped. Chunks longer than
  `max_chunk` (prefill) and fork rows run eagerly;
- attention reads a power-of-two bucket of cache positions (at least MIN_CONTEXT) of the
  batch's slots, gathered; the mask, built on the device from the positions, hides the keys
  past each query;
- the graph ends at the final norm; the LM head (one large matmul) runs eagerly after it, so
  no graph holds logits.
The metadata of such a pass is built on the device from four input tensors (token ids,
positions, slots, each row's last real token) that each call copies into the graph's static
buffers.

On a CPU the static pass runs eagerly (`capture=False`): tests hold it to the ragged forward
there. Graphs are captured only on a CUDA device, lazily on a shape's first use, all in one
memory pool (graphs replay one at a time, in one stream). An engine captures the shapes its
rounds will use before its first request (`capture_ahead`: every batch bucket up to its batch
size, every verify length up to k + 1, context buckets up to AHEAD_MAX_CONTEXT), as vLLM and
SGLang do: a capture costs a few passes, and one paid inside a round would stall it and be
counted as that round's cost (the adaptive controller's samples). Longer contexts are still
captured on first use.
"""

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.forward_metadata import ForwardMetadata, static_metadata

CUDA_GRAPHS_ENV = "SPECCTL_CUDA_GRAPHS"  # "0": every pass eager on a GPU too
MIN_CONTEXT = 256  # smallest bucket of attended cache positions
DEFAULT_MAX_CHUNK = 16  # tokens per row up to which a pass is static (k <= 15)
MAX_GRAPHS = 256  # shapes captured at most; past it, new shapes run eagerly
WARMUP_RUNS = 2  # eager runs of a shape on a side stream before its capture
AHEAD_MAX_CONTEXT = 2048  # context buckets captured ahead at most (longer: on first use)


@dataclass(frozen=True, slots=True)
class StaticShape:
    batch: int  # rows, padded to a power of two
    chunk: int  # tokens appended per row (T)
    context: int  # cache positions attention reads (L bucket)
    last_only: bool  # LogitsMode.LAST: the graph returns each row's last hidden state


@dataclass(slots=True)
class StaticInputs:
    """A static pass's only inputs, on the model's device."""

    token_ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T]
    slots: torch.Tensor  # [B]
    last_index: torch.Tensor  # [B] index in T of each row's last real token

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.token_ids, self.positions, self.slots, self.last_index)

    def clone(self) -> "StaticInputs":
        return StaticInputs(*(t.clone() for t in self.tensors()))

    def copy_(self, other: "StaticInputs") -> None:
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine.copy_(theirs)


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: StaticInputs  # the graph's static input buffers
    hidden: torch.Tensor  # [B, T, hidden] or [B, hidden]: the graph's output


def cuda_graphs_wanted(device: torch.device) -> bool:
    """Graphs are captured on a CUDA device unless SPECCTL_CUDA_GRAPHS=0."""
    return device.type == "cuda" and os.environ.get(CUDA_GRAPHS_ENV, "1") != "0"


def bucket_up(value: int, floor: int, ceiling: int) -> int:
    """The smallest power of two >= max(value, floor), capped at `ceiling` (>= value)."""
    size = 1
    while size < max(value, floor):
        size *= 2
    return min(size, ceiling)


class StaticPasses:
    """Runs a model's decode/verify batches at static shapes (see the module doc)."""

    def __init__(
        self, model: "StaticModel", *, capture: bool, max_chunk: int = DEFAULT_MAX_CHUNK
    ) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {model.device}")
        self.model = model
        self.capture = capture
        self.max_chunk = max_chunk
        self.graphs: dict[StaticShape, _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def accepts(self, batch: ForwardBatch) -> bool:
        """A batch of chunks up to `max_chunk` tokens, without fork rows and not a prefill's,
        that wants logits and whose chunks, padded to the longest, stay within the cache."""
        if batch.has_forks or batch.logits_mode is LogitsMode.NONE or batch.is_prefill:
            return False
        chunk = batch.max_chunk_len
        return chunk <= self.max_chunk and max(batch.start_positions) + chunk <= (
            self.model.max_model_len
        )

    def shape_of(self, batch: ForwardBatch) -> StaticShape:
        chunk = batch.max_chunk_len
        longest = max(batch.start_positions) + chunk
        model = self.model
        return StaticShape(
            batch=bucket_up(batch.num_seqs, 1, max(model.num_slots, batch.num_seqs)),
            chunk=chunk,
            context=bucket_up(longest, MIN_CONTEXT, model.max_model_len),
            last_only=batch.logits_mode is LogitsMode.LAST,
        )

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits as `batch.logits_mode` asks: [B, T, V] or [B, V]."""
        shape = self.shape_of(batch)
        inputs = self._inputs(batch, shape.batch)
        hidden = self._replay(shape, inputs) if self.capture else self._hidden(shape, inputs)
        return self.model.lm_head_logits(hidden[: batch.num_seqs])

    def shapes_ahead(
        self, max_batch: int, chunks: Iterable[int], last_only: bool
    ) -> list[StaticShape]:
        """The shapes of batches of up to `max_batch` rows of `chunks` tokens each, at the
        context buckets up to AHEAD_MAX_CONTEXT."""
        model = self.model
        ceiling = max(model.num_slots, max_batch)
        batches = sorted({bucket_up(n, 1, ceiling) for n in range(1, max_batch + 1)})
        limit = min(model.max_model_len, AHEAD_MAX_CONTEXT)
        contexts = sorted({bucket_up(min(2**e, limit), MIN_CONTEXT, model.max_model_len)
                           for e in range(limit.bit_length() + 1)})  # fmt: skip
        return [
            StaticShape(batch, chunk, context, last_only)
            for context in contexts
            for batch in batches
            for chunk in sorted(set(chunks))
            if 1 <= chunk <= min(self.max_chunk, context)
        ]

    def capture_ahead(self, max_batch: int, chunks: Iterable[int], last_only: bool) -> int:
        """Capture `shapes_ahead` not captured yet (up to MAX_GRAPHS), each from a pass of
        placeholder tokens in slots 0.. at the end of its context bucket: its K/V land where
        no sequence has reached (nothing reads a position before writing it), so this runs
        only while no sequence is live, before an engine's first request. The number
        captured; without graphs (`capture` False) nothing is done."""
        if not self.capture:
            return 0
        captured = 0
        for shape in self.shapes_ahead(max_batch, chunks, last_only):
            if shape in self.graphs or len(self.graphs) >= MAX_GRAPHS:
                continue
            self.graphs[shape] = self._capture(shape, self.placeholder_inputs(shape))
            captured += 1
        return captured

    def placeholder_inputs(self, shape: StaticShape) -> StaticInputs:
        """Inputs of `shape`: token 0 in rows of slots 0..B-1, each chunk ending at the last
        position of the context bucket (so that its longest row falls in that bucket)."""
        start = shape.context - shape.chunk
        batch = ForwardBatch(
            slots=list(range(shape.batch)),
            token_ids=[[0] * shape.chunk for _ in range(shape.batch)],
            start_positions=[start] * shape.batch,
            logits_mode=LogitsMode.LAST if shape.last_only else LogitsMode.ALL,
        )
        assert self.shape_of(batch) == shape, (self.shape_of(batch), shape)
        return self._inputs(batch, shape.batch)

    # -- internals --------------------------------------------------------------------------
    def _inputs(self, batch: ForwardBatch, padded: int) -> StaticInputs:
        """The batch padded to `padded` rows of T = the longest chunk's tokens: a padding row
        repeats the last real row, a short chunk its last token."""
        chunk = batch.max_chunk_len
        extra = padded - batch.num_seqs
        chunks = [c + [c[-1]] * (chunk - len(c)) for c in batch.token_ids]
        chunks += [chunks[-1]] * extra
        lengths = [len(c) for c in batch.token_ids]
        lengths += [lengths[-1]] * extra
        starts = batch.start_positions + [batch.start_positions[-1]] * extra
        slots = batch.slots + [batch.slots[-1]] * extra
        # [B_pad, T]
        positions = torch.tensor(starts)[:, None] + torch.arange(chunk)[None, :]
        device = self.model.device
        return StaticInputs(
            *(
                t.to(device, non_blocking=True)
                for t in (
                    torch.tensor(chunks),
                    positions,
                    torch.tensor(slots),
                    torch.tensor(lengths) - 1,
                )
            )
        )

    def _hidden(self, shape: StaticShape, inputs: StaticInputs) -> torch.Tensor:
        meta = static_metadata(*inputs.tensors(), context_len=shape.context)
        return self.model.static_hidden(meta, shape.last_only)

    def _replay(self, shape: StaticShape, inputs: StaticInputs) -> torch.Tensor:
        captured = self.graphs.get(shape)
        if captured is None:
            if len(self.graphs) >= MAX_GRAPHS:
                return self._hidden(shape, inputs)
            # The warm-up runs are this very pass (its K/V writes are the pass's own, written
            # again by the replay below with the same values).
            captured = self._capture(shape, inputs)
            self.graphs[shape] = captured
        captured.inputs.copy_(inputs)
        captured.graph.replay()
        return captured.hidden.clone()  # the next replay of this shape overwrites its output

    def _capture(self, shape: StaticShape, inputs: StaticInputs) -> _Captured:
        static = inputs.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._hidden(shape, static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self._hidden(shape, static)
        return _Captured(graph, static, hidden)


class StaticModel(Protocol):
    """What StaticPasses needs of a model (LlamaForCausalLM provides it)."""

    num_slots: int
    max_model_len: int
    device: torch.device

    def static_hidden(self, meta: ForwardMetadata, last_only: bool) -> torch.Tensor:
        """The layers and the final norm over `meta`: [B, T, hidden], or [B, hidden] of each
        row's last token when `last_only`."""
        ...

    def lm_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> float32 logits [..., V]."""
        ...
