"""Byte-level BPE tokenizer for the demo pair, saved as a Hugging Face fast tokenizer."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (special tokens get ids 0, 1, 2) and wrap it for transformers."""
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def encode_documents(tok: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """One flat uint16 stream: each document followed by <|endoftext|>."""
    eos = tok.convert_tokens_to_ids(EOS)
    ids = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    parts = [np.asarray([*enc.ids, eos], dtype=np.uint16) for enc in ids]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out_dir)
