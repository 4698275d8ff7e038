"""A decode or verify pass on a CPU as a chain of native kernel calls, with no tensor work.

Why: a draft model (or a narrow target) at a few tokens a row is bound by Python, not by its
arithmetic. The demo drafter's decode step (2 layers, hidden 128) took 1.4 ms on one Xeon core
in the module path (`LlamaForCausalLM.forward`), of which its GEMMs 0.25 ms: the rest went to
building the pass's index tensors (0.27 ms), module calls, an output tensor allocated for
every op, the rotary tables looked up although the native attention reads its own, and
environment lookups. At k = 6 on the wide bench target that was a fifth of a round.

This pass runs the same kernels on the same rows in the same order, so its outputs are the
same bits as the module path's: per layer, RMSNorm (the residual add of the layer before
fused into it, as the module path's `add_forward` fuses the one inside a layer), the fused
q/k/v GEMM, the native attention (rotary, the chunk's K/V written, causal attention), the
output GEMM, the residual add fused into the next RMSNorm, the gated MLP GEMM and the down
GEMM; then the final norm and the LM head with its block maxima. The decoder layers are one
native call (`layers`, over a table of each layer's pointers built once): against a Python
loop of seven kernel calls a layer, the narrow bench target's pass (30 layers) at 1 and 5
tokens 3.96 and 5.22 -> 3.91 and 5.13 ms, the demo drafter's step 93 -> 91 us, interleaved on
a Zen 4 core. Every call takes pointers as integers into workspace buffers kept between
passes (grown to the most rows seen); only each row's (slot, start, length) and the logits
are new tensors (the token ids go to the native embedding gather as a list).

It takes what the native kernels take: a whole float32 model on a CPU whose every layer runs
them (native attention, RMSNorm, weights on the skinny GEMM's panels, no biases), plain rows
(no fork rows), chunks of at most NATIVE_MAX_CHUNK tokens. Anything else, and every pass with
SPECCTL_NATIVE_PASS=0 (before/after figures), takes the module path. Built once after the
weights are packed (loader.py); weights replaced afterwards are not seen by it.
"""

import os
from dataclasses import astuple, dataclass, fields
from typing import TYPE_CHECKING

import torch

from daemon.runtime.host_tensors import int64_tensor
from daemon.runtime.model import native, skinny
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.forward_metadata import NATIVE_MAX_CHUNK, PAD_TOKEN_ID
from daemon.runtime.sampling import block_maxima

if TYPE_CHECKING:
    from daemon.runtime.model.llama import LlamaForCausalLM

DISABLE_ENV = "SPECCTL_NATIVE_PASS"  # "0": every pass through the modules


@dataclass(frozen=True, slots=True)
class LayerPointers:
    """One decoder layer's weights and KV cache as addresses (the tensors stay the model's;
    `NativePass.keep` holds them while the pass lives). A GEMM's `*_big`: its weight is large
    enough to run on every thread (skinny.runs_threaded, the module path's rule)."""

    input_norm: int
    post_norm: int
    qkv: int  # panels [ceil(qkv / 16), hidden, 16]
    qkv_big: bool
    o: int
    o_big: bool
    gate_up: int  # alternating gate/up panels
    gate_up_big: bool
    down: int
    down_big: bool
    keys: int  # [slots, H_kv, max_len, D]
    values: int
    window: int  # 0: none


class NativePass:
    """Runs `forward` for the batches `accepts` takes; see the module docstring."""

    def __init__(self, model: "LlamaForCausalLM") -> None:
        module = native.kernels()
        assert module is not None
        self.kernels = module
        self.model = model
        config = model.config
        self.hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.attn_width = self.heads * self.head_dim
        self.intermediate = config.intermediate_size
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.max_len = model.cache.keys[0].shape[2] if model.cache.keys else 0
        self.layers: list[LayerPointers] = []
        weights: list[torch.Tensor] = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, o = attn.qkv_proj.panels, attn.o_proj.panels
            gate_up, down = mlp.gate_up_proj.gated, mlp.down_proj.panels
            assert qkv is not None and o is not None and gate_up is not None and down is not None
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            weights += (qkv, o, gate_up, down, *norms)
            self.layers.append(
                LayerPointers(
                    input_norm=norms[0].data_ptr(),
                    post_norm=norms[1].data_ptr(),
                    qkv=qkv.data_ptr(),
                    qkv_big=skinny.runs_threaded(qkv),
                    o=o.data_ptr(),
                    o_big=skinny.runs_threaded(o),
                    gate_up=gate_up.data_ptr(),
                    gate_up_big=skinny.runs_threaded(gate_up),
                    down=down.data_ptr(),
                    down_big=skinny.runs_threaded(down),
                    keys=model.cache.keys[attn.layer].data_ptr(),
                    values=model.cache.values[attn.layer].data_ptr(),
                    window=attn.window or 0,
                )
            )
        # int64 [layers, LayerPointers' fields in order]: the table `layers` reads
        self.layer_table = torch.tensor(
            [[int(value) for value in astuple(layer)] for layer in self.layers], dtype=torch.int64
        ).reshape(len(self.layers), len(fields(LayerPointers)))
        assert model.norm is not None
        self.final_norm = model.norm.weight.data_ptr()
        head = model.tied_head
        if head is None:
            assert model.lm_head is not None and model.lm_head.panels is not None
            head = model.lm_head.panels
        self.head = head
        self.head_threads = skinny.runs_threaded(head)
        self.vocab = model.vocab_size
        # the embedding rows are gathered from the tied head's panels, or the dense table
        if model.tied_head is not None:
            table, self.tied, self.table_rows = model.tied_head, True, self.vocab
        else:
            assert model.embed_tokens is not None
            table = model.embed_tokens.weight.detach()
            self.tied, self.table_rows = False, table.shape[0]
        self.table = table.data_ptr()
        cos, signed_sin = model.rotary.cos, model.rotary.signed_sin
        self.cos, self.signed_sin = cos.data_ptr(), signed_sin.data_ptr()
        # everything whose address is taken above, alive as long as this pass
        caches = [*model.cache.keys, *model.cache.values]
        self.keep = (weights, head, table, model.norm.weight, cos, signed_sin, caches)
        self.capacity = 0  # rows the workspace holds
        self.buffers: dict[str, torch.Tensor] = {}
        self.addresses: dict[str, int] = {}  # the buffers' data pointers

    @staticmethod
    def supports(model: "LlamaForCausalLM") -> bool:
        """Whether every layer of `model` runs the native kernels (module docstring)."""
        if native.kernels() is None or not native.enabled():
            return False
        if os.environ.get(DISABLE_ENV, "1") == "0":
            return False
        if not model.is_whole or model.dtype != torch.float32:
            return False
        if torch.device(model.device).type != "cpu":
            return False
        if model.norm is None or not model.norm.is_native:
            return False
        if model.tied_head is None and (
            model.lm_head is None or model.lm_head.panels is None or model.lm_head.bias is not None
        ):
            return False
        if model.tied_head is None and (
            model.embed_tokens is None or not model.embed_tokens.weight.is_contiguous()
        ):
            return False  # the native gather reads the dense table's rows at its width
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if not attn.is_native or attn.q_norm is not None:
                return False
            if any(linear.bias is not None for linear in linears):
                return False
            if attn.qkv_proj.panels is None or attn.o_proj.panels is None:
                return False
            if mlp.gate_up_proj.gated is None or mlp.down_proj.panels is None:
                return False
            if not (layer.input_layernorm.is_native and layer.post_attention_layernorm.is_native):
                return False
        return True

    @staticmethod
    def accepts(batch: ForwardBatch) -> bool:
        return not batch.has_forks and batch.max_chunk_len <= NATIVE_MAX_CHUNK

    def _workspace(self, rows: int) -> dict[str, int]:
        """Addresses of the pass's intermediate buffers for `rows` rows (grown when short)."""
        if rows > self.capacity:
            capacity = max(rows, 2 * self.capacity)
            widths = {
                "embedded": self.hidden,
                "normed": self.hidden,
                "res_a": self.hidden,
                "res_b": self.hidden,
                "qkv": self.qkv_width,
                "attn": self.attn_width,
                "o": self.hidden,
                "gated": self.intermediate,
                "mlp": self.hidden,
            }
            self.buffers = {
                name: torch.empty(capacity, width, dtype=torch.float32)
                for name, width in widths.items()
            }
            self.capacity = capacity
            self.addresses = {name: buffer.data_ptr() for name, buffer in self.buffers.items()}
        return self.addresses

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The batch's logits as `LlamaForCausalLM.forward` gives them: [B, T, V] (ALL),
        [B, V] (LAST) or None (NONE); K/V of every real token written to its slot."""
        k = self.kernels
        num_seqs, chunk = batch.num_seqs, batch.max_chunk_len
        rows = num_seqs * chunk
        hidden, eps = self.hidden, self.eps
        ws = self._workspace(rows)
        normed, qkv, attn, o = ws["normed"], ws["qkv"], ws["attn"], ws["o"]
        gated, mlp, res_a, res_b = ws["gated"], ws["mlp"], ws["res_a"], ws["res_b"]
        # [B * T] padded token ids; [B * 3] (slot, start, chunk length) for the attention
        flat_ids: list[int] = []
        native_rows: list[int] = []
        for slot, start, ids in zip(
            batch.slots, batch.start_positions, batch.token_ids, strict=True
        ):
            flat_ids += ids
            if len(ids) < chunk:
                flat_ids += [PAD_TOKEN_ID] * (chunk - len(ids))
            native_rows += (slot, start, len(ids))
        rows_t = int64_tensor(native_rows)
        rows_ptr = rows_t.data_ptr()
        # [B * T, hidden]: the embedding rows, read by the first norm (a bad id: ValueError)
        k.embed(self.table, self.table_rows, hidden, self.tied, flat_ids, ws["embedded"])
        # every decoder layer in one native call; per layer:
        #   norm(residual (+ the last MLP's output)) -> qkv GEMM -> attention -> o GEMM ->
        #   norm(residual + o) -> gate/up GEMM -> down GEMM
        # the residual stream alternating between res_a and res_b; it returns the buffer the
        # stream ends in and the last MLP's output (0: no layers), which the final norm adds
        threads = torch.get_num_threads()
        wide_min, zmm = skinny.wide_min_rows(), skinny.zmm_blocks()
        residual, pending = k.layers(
            self.layer_table.data_ptr(),
            len(self.layers),
            normed,
            qkv,
            attn,
            o,
            gated,
            mlp,
            res_a,
            res_b,
            ws["embedded"],
            rows_ptr,
            self.cos,
            self.signed_sin,
            num_seqs,
            chunk,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.max_len,
            hidden,
            self.qkv_width,
            self.attn_width,
            self.intermediate,
            threads,
            wide_min,
            zmm,
            eps,
            self.scale,
        )
        if batch.logits_mode is LogitsMode.NONE:
            return None
        row_bytes = hidden * 4
        shape: tuple[int, ...]
        if batch.logits_mode is LogitsMode.LAST:  # each row's last real token: [B, hidden]
            shape, out_rows = (num_seqs,), num_seqs
            final = torch.empty(num_seqs, hidden, dtype=torch.float32)
            for b, ids in enumerate(batch.token_ids):
                at = (b * chunk + len(ids) - 1) * row_bytes
                k.rmsnorm(residual + at, pending + at, self.final_norm,
                          final.data_ptr() + b * row_bytes, 0, 1, hidden, eps)  # fmt: skip
        else:  # every position: [B * T, hidden]
            shape, out_rows = (num_seqs, chunk), rows
            final = torch.empty(rows, hidden, dtype=torch.float32)
            k.rmsnorm(residual, pending, self.final_norm, final.data_ptr(), 0, rows, hidden, eps)
        # [..., V] and each block of 64 logits' max (sampling/block_maxima.py)
        logits = torch.empty(*shape, self.vocab, dtype=torch.float32)
        maxima = torch.empty(*shape, -(-self.vocab // skinny.BMAX_BLOCK), dtype=torch.float32)
        k.gemm(final.data_ptr(), hidden, self.head.data_ptr(), logits.data_ptr(), self.vocab,
               out_rows, self.vocab, hidden, threads if self.head_threads else 1, False,
               maxima.data_ptr(), wide_min, zmm)  # fmt: skip
        block_maxima.remember(logits, maxima)
        return logits
