"""Lean Llama-family decoder (Llama, Qwen2, Qwen3, Mistral) over a static per-slot KV cache."""

import torch
import torch.nn.functional as F
from torch import nn

from daemon.runtime.errors import ModelLoadError, RequestError
from daemon.runtime.model import skinny
from daemon.runtime.model.attention import Attention
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.forward_metadata import ForwardMetadata, build_metadata, check_batch
from daemon.runtime.model.kv_cache import KVCache
from daemon.runtime.model.linear import Linear, can_use_skinny, prepack_enabled
from daemon.runtime.model.mlp import GatedMLP
from daemon.runtime.model.native_pass import NativePass
from daemon.runtime.model.rmsnorm import RMSNorm
from daemon.runtime.model.rotary import RotaryEmbedding
from daemon.runtime.model.sharding import shard_config
from daemon.runtime.model.static_pass import StaticPasses
from daemon.runtime.parallel.group import TensorParallel
from daemon.runtime.sampling import block_maxima


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        dtype: torch.dtype,
        tp: TensorParallel,
        cache_layer: int,
    ) -> None:
        """`config` is this rank's shard of the model (see sharding.shard_config)."""
        super().__init__()
        self.tp = tp
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.self_attn = Attention(config, layer, dtype, cache_layer)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.mlp_bias, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        meta: ForwardMetadata,
        cache: KVCache,
    ) -> torch.Tensor:
        """`x` [B, T, hidden] -> [B, T, hidden]."""
        # row-parallel outputs: each rank holds a partial sum, the all-reduce completes it
        attn = self.tp.all_reduce(self.self_attn(self.input_layernorm(x), cos_sin, meta, cache))
        # x + attn, and its norm: one call on a CPU with the native kernels
        x, normed = self.post_attention_layernorm.add_forward(x, attn)
        return x + self.tp.all_reduce(self.mlp(normed))


class LlamaForCausalLM(nn.Module):
    """The lean runner (a `CausalLM`). Weights are created on the meta device: load them with
    `load_state_dict(..., assign=True)` (see loader.py) before the first forward.

    Supports fork rows (see ForwardBatch) once `enable_forks` has allocated a branch cache.

    With `tp` of size N this is one rank of a tensor-parallel model: it holds 1/N of the heads,
    K/V heads and MLP columns (sharding.py) and its forward takes part in two all-reduces per
    layer, so every rank of the group must run the same calls in the same order (see
    parallel/leader.py)."""

    supports_forks = True

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_model_len: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device,
        tp: TensorParallel | None = None,
        layers: tuple[int, int] | None = None,
    ) -> None:
        """`layers`: a pipeline stage's layers [start, end) (None: all of them). The first
        stage embeds the tokens, the last one holds the final norm and the LM head."""
        super().__init__()
        self.config = config
        self.tp = tp or TensorParallel(0, 1)
        local = shard_config(config, self.tp.size)
        num_layers = config.num_hidden_layers
        start, end = layers or (0, num_layers)
        if not 0 <= start < end <= num_layers:
            raise ModelLoadError(
                f"{config.source}: pipeline stage layers [{start}, {end}) are not within the "
                f"model's {num_layers} layers"
            )
        self.layer_offset = start
        self.is_first, self.is_last = start == 0, end == num_layers
        tied = config.tie_word_embeddings
        self.vocab_size = config.vocab_size
        self.max_model_len = max_model_len
        self.num_slots = num_slots
        self.device = device
        self.dtype = dtype
        with torch.device("meta"):
            # _weight skips the random init, whose meta-device path imports torch._dynamo (and
            # with it triton, which prints binding-leak warnings at exit).
            self.embed_tokens: nn.Embedding | None = None
            if self.is_first or (self.is_last and tied):
                embed = torch.empty(config.vocab_size, config.hidden_size, dtype=dtype)
                self.embed_tokens = nn.Embedding(
                    config.vocab_size, config.hidden_size, _weight=embed
                )
            stage = [
                DecoderLayer(local, start + i, dtype, self.tp, cache_layer=i)
                for i in range(end - start)
            ]
            self.layers = nn.ModuleList(stage)
            self.norm: RMSNorm | None = None
            self.lm_head: Linear | None = None
            if self.is_last:
                self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
                if not tied:
                    self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype=dtype)
        self.rotary = RotaryEmbedding(config, max_model_len, dtype).to(device)
        # decode/verify passes at static shapes (CUDA graphs); None: every pass eager
        self.static: StaticPasses | None = None
        # decode/verify passes on a CPU as native kernel calls (native_pass.py); None: modules
        self.native_pass: NativePass | None = None
        # a tied LM head on the skinny GEMM: the embedding held as its panels only
        # [ceil(V / 16), hidden, 16] (pack_tied_head); None: the embedding's dense weight
        self.tied_head: torch.Tensor | None = None
        self.cache = KVCache(
            num_layers=end - start,
            num_slots=num_slots,
            num_kv_heads=local.num_key_value_heads,
            max_model_len=max_model_len,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
            # the weights (on the meta device so far) are read next: room for both, or neither
            weights_bytes=sum(p.numel() * p.element_size() for p in self.parameters()),
        )

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, hidden: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Append each chunk to its slot's cache; logits float32 as `batch.logits_mode` asks.

        A pipeline stage after the first takes the previous stage's `hidden` [B, T, hidden];
        a stage before the last returns its own hidden states [B, T, hidden] instead of logits."""
        check_batch(
            batch,
            num_slots=self.num_slots,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            num_branch_slots=self.cache.num_branch_slots,
            branch_len=self.cache.branch_len,
        )
        if self.static is not None and hidden is None and self.static.accepts(batch):
            return self.static.forward(batch)
        if self.native_pass is not None and hidden is None and NativePass.accepts(batch):
            return self.native_pass.forward(batch)
        meta = build_metadata(batch, self.device)
        if meta.native_rows is not None and self.dtype == torch.float32:
            meta.rope_tables = (self.rotary.cos, self.rotary.signed_sin)
        x = self._layers(meta, hidden)
        if not self.is_last:
            return x
        if batch.logits_mode is LogitsMode.NONE:
            return None
        return self.lm_head_logits(self._final(x, meta, batch.logits_mode is LogitsMode.LAST))

    @property
    def is_whole(self) -> bool:
        """The whole model on one rank: neither a pipeline stage nor a tensor-parallel rank."""
        return self.is_first and self.is_last and self.tp.size == 1

    def static_hidden(self, meta: ForwardMetadata, last_only: bool) -> torch.Tensor:
        """The whole model up to the final norm over prepared metadata (static_pass.py):
        [B, T, hidden], or [B, hidden] of each row's last token when `last_only`."""
        return self._final(self._layers(meta, None), meta, last_only)

    def enable_static_passes(self, *, capture: bool) -> None:
        """Run decode/verify batches at static shapes (static_pass.py), captured as
        CUDA graphs when `capture` (a CUDA device only). Whole models without tensor
        parallelism only: a pipeline stage or a rank of a group keeps the eager path."""
        if not self.is_whole:
            raise RequestError("static passes need the whole model on one rank")
        self.static = StaticPasses(self, capture=capture)

    def enable_native_pass(self) -> bool:
        """Run plain decode and verify batches as native kernel calls (native_pass.py), where
        every layer runs those kernels; False (nothing changed) elsewhere. Call once the
        weights are packed: weights replaced afterwards are not seen by that pass."""
        if not NativePass.supports(self):
            return False
        self.native_pass = NativePass(self)
        return True

    def _layers(self, meta: ForwardMetadata, hidden: torch.Tensor | None) -> torch.Tensor:
        """Embedding (first stage) and this runner's layers: [B, T, hidden]."""
        cos_sin = self.rotary(meta.positions)
        if self.is_first:
            x = self.embed(meta.token_ids)
        elif hidden is None:
            raise RequestError("a pipeline stage after the first needs the previous hidden states")
        else:
            x = hidden
        for layer in self.layers:
            x = layer(x, cos_sin, meta, self.cache)
        return x

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`token_ids` [B, T] -> [B, T, hidden]."""
        if self.tied_head is not None:
            # row v of the embedding is column v % 16 of panel v // 16
            return self.tied_head[token_ids // skinny.PANEL, :, token_ids % skinny.PANEL]
        assert self.embed_tokens is not None
        return self.embed_tokens(token_ids)

    def pack_tied_head(self) -> bool:
        """Put a tied LM head on the skinny GEMM (linear.py says why): the embedding becomes
        its panels, the same memory, from which the first stage also gathers its rows. False
        (nothing changed) without a tied head on this stage, or where the kernel cannot run."""
        embed = self.embed_tokens
        if self.tied_head is not None or embed is None or self.lm_head is not None:
            return False
        if not self.is_last or not prepack_enabled() or not can_use_skinny(embed.weight):
            return False
        self.tied_head = skinny.pack(embed.weight.detach())
        embed.weight = nn.Parameter(embed.weight.new_empty(0), requires_grad=False)
        return True

    def _final(self, x: torch.Tensor, meta: ForwardMetadata, last_only: bool) -> torch.Tensor:
        """The final norm over every position [B, T, hidden], or each row's last [B, hidden]."""
        if last_only:
            # [B, hidden]
            x = x[torch.arange(x.shape[0], device=x.device), meta.last_index]
        assert self.norm is not None
        return self.norm(x)

    def lm_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> float32 logits [..., V]."""
        panels, width = self.tied_head, self.vocab_size
        if self.lm_head is not None and self.lm_head.bias is None:
            panels, width = self.lm_head.panels, self.lm_head.out_features
        if panels is not None and hidden.dtype == torch.float32:
            # and each block of 64 logits' max, for the samplers (sampling/block_maxima.py)
            logits, maxima = skinny.logits_with_block_maxima(hidden, panels, width)
            block_maxima.remember(logits, maxima)
            return logits
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        assert self.embed_tokens is not None
        # tied: the embedding's dense weight (a packed copy would double the largest tensor)
        return F.linear(hidden, self.embed_tokens.weight).float()

    def free_slot(self, slot: int) -> None:
        """Nothing to release: the next user of `slot` starts at position 0 and overwrites it."""
        if not 0 <= slot < self.num_slots:
            raise RequestError(f"slot {slot} out of range: the runner has {self.num_slots} slots")

    def enable_forks(self, num_branch_slots: int, branch_len: int) -> None:
        """Allocate the branch cache: `num_branch_slots` branches of `branch_len` own positions
        each (a branch's context stays in its parent slot)."""
        self.cache.enable_branches(num_branch_slots, branch_len)

    def promote(self, branch_slot: int, parent_slot: int, fork_position: int, length: int) -> None:
        """The branch won: its first `length` own positions become the parent's positions
        `fork_position ..`; the parent then continues exactly as the branch would have."""
        self.cache.promote(branch_slot, parent_slot, fork_position, length)
