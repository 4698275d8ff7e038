"""Incremental detokenization for streaming: text out as tokens arrive, never a broken character,
never a piece of a stop string.

Decoding each new token alone is wrong in two ways: byte-level BPE splits multi-byte characters
across tokens (decoding half a character gives U+FFFD), and sentencepiece tokenizers decide a
token's leading space from its left neighbour. So the new text is taken as
`decode(ids[prefix:]) - decode(ids[prefix:read])` (vLLM's prefix/read offsets), and held back
while it ends in U+FFFD (an unfinished character).

Stop strings are detected by the engine, which ends the request at the token that completes
one; the text is then cut before it (as `specctl generate` does). Until then the last
`len(longest stop) - 1` characters are held back, since they may be the start of a stop string
that the next tokens complete. The final text is the whole output decoded at once and cut at the
first stop string, so streamed and non-streamed text are the same string.
"""

from typing import Any

from daemon.runtime.engine.stop import truncate_at_stop

REPLACEMENT_CHAR = "\ufffd"
NUM_PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded with the first output tokens (leading space)


class IncrementalDetokenizer:
    """Turns one request's token deltas into text deltas; `text` is what was handed out."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: tuple[str, ...] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._context = list(prompt_token_ids[-NUM_PROMPT_CONTEXT_TOKENS:])
        self._ids = list(self._context)  # context + output
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._decoded = ""  # output text decoded so far (complete characters only)
        self._stop = stop
        self._hold_chars = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # handed out so far

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[len(self._context) :]

    def add(self, new_token_ids: list[int], is_finished: bool) -> str:
        """The text to hand out for these new tokens (may be empty)."""
        self._ids.extend(new_token_ids)
        if is_finished:
            final = self._decode(self.output_token_ids)
            if self._stop:
                final = truncate_at_stop(final, self._stop)
            return self._hand_out(final)
        self._decode_new()
        decoded = self._decoded
        if self._stop:
            cut = truncate_at_stop(decoded, self._stop)
            safe_len = len(cut) if len(cut) < len(decoded) else len(decoded) - self._hold_chars
            decoded = decoded[: max(safe_len, 0)]
        return self._hand_out(decoded)

    def _decode_new(self) -> None:
        if len(self._ids) == self._read_offset:
            return
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR):
            self._decoded += full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)

    def _hand_out(self, text: str) -> str:
        """What `text` adds to what was handed out (text extends it: held-back text is only ever
        completed, and the final decode equals the incremental one for the tokenizers served)."""
        new = text[len(self.text) :]
        self.text += new
        return new

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
