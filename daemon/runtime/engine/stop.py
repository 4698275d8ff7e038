"""Stop conditions: EOS and stop token ids, stop strings, max_tokens, the context limit."""

from collections.abc import Callable
from dataclasses import dataclass, field

from daemon.runtime.sampling.params import SamplingParams

Detokenize = Callable[[list[int]], str]

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"  # the caller gave up on the request (a client went away)
FINISH_ERROR = "error"  # the engine failed; the request ended without a result

# Stop strings are looked for in the text of the last few tokens only, which keeps each check
# O(1) in the output length: at least this many, and more than the longest stop string has
# bytes (a token decodes to one byte or more, but for the odd special token decoding to none:
# STOP_WINDOW_SLACK). A fixed window of 32 never found a stop string of 33 tokens: the request
# ran to max_tokens, its text cut at the stop.
STOP_STRING_WINDOW_TOKENS = 32
STOP_WINDOW_SLACK = 8
REPLACEMENT = "\ufffd"  # what a decoder makes of the bytes of a character not yet complete


@dataclass(slots=True)
class StopChecker:
    """Decides, token by token, whether a sequence is finished."""

    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_total_len: int  # prompt + output may not exceed this (the KV cache slot)
    detokenize: Detokenize | None = None
    window: int = field(init=False)  # tokens looked back through for a stop string

    def __post_init__(self) -> None:
        longest = max(
            (len(s.encode("utf-8", "surrogatepass")) for s in self.params.stop), default=0
        )
        self.window = max(STOP_STRING_WINDOW_TOKENS, longest + STOP_WINDOW_SLACK)

    def check(self, token_ids: list[int], num_prompt_tokens: int) -> str | None:
        """The finish reason once the newest token of `token_ids` (prompt + output) ends the
        sequence, else None.

        Called after each appended token, so tokens accepted past a stop are never appended.
        A stop string's tokens stay in token_ids; `truncate_at_stop` cuts it off the text.
        """
        last = token_ids[-1]
        if not self.params.ignore_eos and last in self.eos_token_ids:
            return FINISH_STOP
        if last in self.params.stop_token_ids:
            return FINISH_STOP
        if self.params.stop and self.detokenize is not None:
            start = max(num_prompt_tokens, len(token_ids) - self.window)
            if self._completes_stop(token_ids[start:]):
                return FINISH_STOP
        num_output = len(token_ids) - num_prompt_tokens
        if num_output >= self.params.max_tokens or len(token_ids) >= self.max_total_len:
            return FINISH_LENGTH
        return None

    def _completes_stop(self, window_ids: list[int]) -> bool:
        """Whether a stop string ends inside the text of the window's last token."""
        assert self.detokenize is not None
        window = self.detokenize(window_ids)
        # A character split over tokens decodes to U+FFFD until its last byte comes: the
        # text before the newest token is measured without it, or a stop string ending in
        # that character (Chinese punctuation, an emoji) was looked for one place too late
        # and never found.
        prev_len = len(self.detokenize(window_ids[:-1]).rstrip(REPLACEMENT))
        # Only a match that the newest token completed counts (older ones were checked).
        return any(
            window.find(stop, max(0, prev_len - len(stop) + 1)) != -1 for stop in self.params.stop
        )


def truncate_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to (not including) the first stop string in it."""
    cut = min((i for i in (text.find(s) for s in stops) if i != -1), default=len(text))
    return text[:cut]
