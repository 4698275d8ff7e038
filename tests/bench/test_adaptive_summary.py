"""The bench's adaptive summary: ratios of the medians, and the paired ratios per repeat."""

from bench.compare import Row, adaptive_summary, paired_ratio


def _row(mode: str, repeats: list[float]) -> Row:
    median = sorted(repeats)[(len(repeats) - 1) // 2]
    return Row("specctl", mode, 16, "code", median, None, None, 64, repeats=repeats)


def test_a_slow_spell_falls_on_both_sides_of_a_paired_ratio() -> None:
    """Repeat 2 ran in a slow spell (every configuration at half speed). The medians then
    compare adaptive's slow repeat with k = 2's fast one; the paired ratios do not."""
    plain = _row("target-only", [100.0, 50.0, 101.0])
    fixed = _row("spec k=2", [110.0, 55.0, 109.0])
    adaptive = _row("spec adaptive", [111.0, 56.0, 55.0 * 2 * 0.99])  # 1%-2% either side
    (summary,) = adaptive_summary([plain, fixed, adaptive])
    assert summary["best_fixed"] == "spec k=2"
    assert round(float(summary["adaptive_over_best_fixed"]), 3) == round(108.9 / 109.0, 3)
    paired = summary["adaptive_over_best_fixed_paired"]
    assert paired == sorted([111 / 110, 56 / 55, 108.9 / 109])[1]
    assert paired == paired_ratio(adaptive, fixed)
    assert (
        summary["adaptive_over_target_only_paired"] == sorted([111 / 100, 56 / 50, 108.9 / 101])[1]
    )


def test_no_paired_ratio_without_repeats_to_pair() -> None:
    one = _row("spec adaptive", [100.0])
    assert paired_ratio(one, _row("spec k=2", [90.0])) is None
    assert paired_ratio(_row("a", [1.0, 2.0]), _row("b", [1.0, 2.0, 3.0])) is None
