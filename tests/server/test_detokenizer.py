"""Incremental detokenization with the demo pair's byte-level BPE tokenizer: characters split
across tokens, stop strings split across deltas, and agreement with decoding all at once."""

import random
from typing import Any

import pytest

from daemon.runtime.engine.builder import load_tokenizer
from daemon.runtime.engine.stop import truncate_at_stop
from specctl.server.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from tests.server.serve_process import DEMO_TARGET

MULTI_BYTE = "naïve café — 日本語 🙂 ok\n    return x"
PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(DEMO_TARGET)


def _stream(detok: IncrementalDetokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    """Feed `ids` in deltas of the given sizes; the last delta finishes the request."""
    deltas, start = [], 0
    for n in sizes:
        chunk = ids[start : start + n]
        start += n
        deltas.append(detok.add(chunk, is_finished=start >= len(ids)))
    assert start >= len(ids)
    return deltas


def _random_sizes(total: int, seed: int) -> list[int]:
    rng, sizes = random.Random(seed), []
    while sum(sizes) < total:
        sizes.append(rng.randint(1, 5))
    return sizes


def test_multi_byte_characters_split_across_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode(MULTI_BYTE)
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids)  # the case under test
    for sizes in ([1] * len(ids), _random_sizes(len(ids), 0), _random_sizes(len(ids), 1)):
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT))
        deltas = _stream(detok, ids, sizes)
        assert not any(REPLACEMENT_CHAR in d for d in deltas)
        assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == MULTI_BYTE
        assert detok.text == MULTI_BYTE


def test_stop_string_spanning_deltas_is_never_sent(tokenizer: Any) -> None:
    stop = "<END>"
    ids = tokenizer.encode("hello world" + stop + " more text")
    # the engine ends the request at the token that completes the stop string
    end = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
    ids = ids[:end]
    for sizes in ([1] * len(ids), _random_sizes(len(ids), 2), [len(ids)]):
        detok = IncrementalDetokenizer(tokenizer, [], stop=(stop,))
        deltas = _stream(detok, ids, sizes)
        sent_before_end = "".join(deltas[:-1])
        assert "hello world".startswith(sent_before_end)
        assert "".join(deltas) == "hello world"


def test_text_that_only_looks_like_a_stop_is_released(tokenizer: Any) -> None:
    text = "the END is not ENDX-near, EN"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=("ENDXY",))
    deltas = [detok.add([i], is_finished=False) for i in ids]
    sent = "".join(deltas)
    assert text.startswith(sent) and len(sent) >= len(text) - len("ENDXY") + 1
    assert sent + detok.add([], is_finished=True) == text


def test_final_text_matches_generate_even_when_cut_mid_character(tokenizer: Any) -> None:
    ids = tokenizer.encode("日本")[:-1]  # the output ended inside a character
    whole = truncate_at_stop(tokenizer.decode(ids, skip_special_tokens=True), ())
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(_stream(detok, ids, [1] * len(ids))) == whole
    assert whole.endswith(REPLACEMENT_CHAR)


def test_special_tokens_are_skipped(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    ids = [*tokenizer.encode("ok then"), eos]
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(_stream(detok, ids, [1] * len(ids))) == "ok then"
