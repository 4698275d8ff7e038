"""Fallback runner: any transformers AutoModelForCausalLM behind the CausalLM surface.

One DynamicCache per slot, rolled back with `crop`; if a cache cannot be cropped the slot's
prefix is recomputed from the tokens it holds. Sequences run one at a time: correctness first.
"""

from pathlib import Path
from typing import Any

import torch

from daemon.runtime.errors import ModelLoadError, RequestError
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.forward_metadata import check_batch


class HFCausalLM:
    supports_forks = False  # fork rows are refused (check_batch: no branch cache)

    def __init__(
        self, model: Any, *, num_slots: int, max_model_len: int, device: torch.device
    ) -> None:
        self.model = model
        head = model.get_output_embeddings()
        vocab_size = head.weight.shape[0] if head is not None else model.config.vocab_size
        self.vocab_size = int(vocab_size)  # logits width
        self.max_model_len = max_model_len
        self.num_slots = num_slots
        self.device = device
        self.dtype = model.dtype
        self._caches: dict[int, Any] = {}  # slot -> transformers DynamicCache
        self._tokens: dict[int, list[int]] = {}  # slot -> the tokens its cache holds

    @classmethod
    def load(
        cls,
        model_dir: Path,
        *,
        dtype: torch.dtype,
        device: torch.device,
        num_slots: int,
        max_model_len: int,
    ) -> "HFCausalLM":
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=dtype, local_files_only=True
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"{model_dir}: transformers cannot load the model: {exc}") from exc
        model = model.to(device).eval().requires_grad_(False)
        return cls(model, num_slots=num_slots, max_model_len=max_model_len, device=device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Run each sequence against its own cache; same outputs as the lean runner."""
        check_batch(
            batch,
            num_slots=self.num_slots,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
        )
        mode = batch.logits_mode
        rows = [
            self._append(slot, chunk, start, keep_all=mode is LogitsMode.ALL)
            for slot, chunk, start in zip(
                batch.slots, batch.token_ids, batch.start_positions, strict=True
            )
        ]
        if mode is LogitsMode.NONE:
            return None
        if mode is LogitsMode.LAST:
            # [B, V]
            return torch.stack([row[-1] for row in rows])
        # [B, T_max, V]; rows past a chunk's length are zero
        out = rows[0].new_zeros((batch.num_seqs, batch.max_chunk_len, rows[0].shape[-1]))
        for b, row in enumerate(rows):
            out[b, : row.shape[0]] = row
        return out

    def _append(self, slot: int, chunk: list[int], start: int, *, keep_all: bool) -> torch.Tensor:
        """Append `chunk` to the slot after `start` tokens; float32 logits [T or 1, V]."""
        held = self._tokens.get(slot, [])
        if start > len(held):
            raise RequestError(
                f"slot {slot}: start_position {start} but the slot holds {len(held)} tokens"
            )
        cache = self._rolled_back_cache(slot, start)
        sequence = held[:start] + chunk
        # [1, T'] the tokens the cache lacks: the chunk, or the whole prefix after a reset
        input_ids = torch.tensor([sequence[cache.get_seq_length() :]], device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        self._caches[slot] = cache
        self._tokens[slot] = sequence
        # [T or 1, V]
        return out.logits[0, -(len(chunk) if keep_all else 1) :].float()

    def _rolled_back_cache(self, slot: int, start: int) -> Any:
        """The slot's cache cut to `start` tokens, or an empty cache if it cannot be cut."""
        from transformers import DynamicCache

        cache = self._caches.get(slot)
        if cache is None or start == 0:
            return DynamicCache()
        cached = cache.get_seq_length()
        if cached > start:
            try:
                cache.crop(start - cached)  # negative: the number of tokens to drop
            except (RuntimeError, ValueError, NotImplementedError):
                return DynamicCache()
        return cache if cache.get_seq_length() == start else DynamicCache()

    def free_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise RequestError(f"slot {slot} out of range: the runner has {self.num_slots} slots")
        self._caches.pop(slot, None)
        self._tokens.pop(slot, None)
