"""Measured cost of draft steps and verify passes, by batch size and tokens per sequence."""

from dataclasses import dataclass, field

EMA_WEIGHT = 0.2  # weight of the newest measurement


def batch_bucket(batch_size: int) -> int:
    """Batch sizes are grouped by powers of two: 1, 2, 4, 8, ..."""
    bucket = 1
    while bucket < batch_size:
        bucket *= 2
    return bucket


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - EMA_WEIGHT) * old + EMA_WEIGHT * new


@dataclass(slots=True)
class CostModel:
    """EMAs of seconds per draft forward step and per verify pass.

    Unmeasured verify lengths are interpolated linearly from the measured ones at the same
    batch bucket; with a single measurement the cost is assumed flat in length (optimistic, so
    the controller tries speculation and measures what it really costs).
    """

    draft_step_s: dict[int, float] = field(default_factory=dict)  # bucket -> s per step
    verify_s: dict[int, dict[int, float]] = field(default_factory=dict)  # bucket -> T -> s

    def record_draft(self, batch_size: int, num_steps: int, seconds: float) -> None:
        if num_steps > 0:
            key = batch_bucket(batch_size)
            self.draft_step_s[key] = _ema(self.draft_step_s.get(key), seconds / num_steps)

    def record_verify(self, batch_size: int, tokens_per_seq: int, seconds: float) -> None:
        per_len = self.verify_s.setdefault(batch_bucket(batch_size), {})
        per_len[tokens_per_seq] = _ema(per_len.get(tokens_per_seq), seconds)

    def has_bucket(self, batch_size: int) -> bool:
        return batch_bucket(batch_size) in self.verify_s

    def has_verify(self, batch_size: int, tokens_per_seq: int) -> bool:
        return tokens_per_seq in self.verify_s.get(batch_bucket(batch_size), {})

    def draft_cost(self, batch_size: int) -> float:
        return _nearest(self.draft_step_s, batch_bucket(batch_size), default=0.0)

    def verify_cost(self, batch_size: int, tokens_per_seq: int) -> float | None:
        """Seconds for one verify pass, or None before anything was measured.

        A batch size measured at a single length borrows the shape of the cost curve (cost at
        T relative to the same measured length) from the nearest batch size measured at
        several lengths, so a new batch size needs no exploratory speculative round.
        """
        if not self.verify_s:
            return None
        bucket = batch_bucket(batch_size)
        per_len = self.verify_s.get(bucket)
        if per_len is None:
            per_len = self.verify_s[_nearest_key(self.verify_s, bucket)]
        if len(per_len) == 1 and tokens_per_seq not in per_len:
            ((length, seconds),) = per_len.items()
            shaped = {b: t for b, t in self.verify_s.items() if len(t) > 1 and length in t}
            if shaped:
                ref = shaped[_nearest_key(shaped, bucket)]
                return seconds * _interpolate(ref, tokens_per_seq) / ref[length]
        return _interpolate(per_len, tokens_per_seq)


def _nearest_key(table: dict[int, object], key: int) -> int:
    return min(table, key=lambda k: abs(k - key))


def _nearest(table: dict[int, float], key: int, default: float) -> float:
    return table[_nearest_key(table, key)] if table else default


def _interpolate(per_len: dict[int, float], length: int) -> float:
    if length in per_len:
        return per_len[length]
    lengths = sorted(per_len)
    if len(lengths) == 1:
        return per_len[lengths[0]]
    lo = max((n for n in lengths if n < length), default=lengths[0])
    hi = min((n for n in lengths if n > length), default=lengths[-1])
    if lo == hi:  # outside the measured range: extend the nearest segment
        lo, hi = (lengths[0], lengths[1]) if length < lengths[0] else (lengths[-2], lengths[-1])
    slope = (per_len[hi] - per_len[lo]) / (hi - lo)
    return max(0.0, per_len[lo] + slope * (length - lo))
