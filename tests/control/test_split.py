"""The automatic pipeline split."""

import pytest

from specctl.planner.split import split_layers

GIB = 2**30


def test_layers_in_proportion_to_free_memory() -> None:
    assert split_layers(80, [108 * GIB, 27 * GIB], [GIB, GIB]) == [64, 16]
    assert split_layers(80, [60 * GIB, 60 * GIB], [GIB, GIB]) == [40, 40]
    assert split_layers(10, [3 * GIB, 1 * GIB, 1 * GIB], [GIB // 10] * 3) == [6, 2, 2]


def test_a_stage_past_its_capacity_gives_layers_to_the_others() -> None:
    # proportions say 40:40, but the second stage holds only 10 layers
    assert split_layers(80, [100 * GIB, 100 * GIB], [GIB, 10 * GIB]) == [70, 10]


def test_every_stage_gets_at_least_one_layer() -> None:
    assert split_layers(80, [100 * GIB, -5 * GIB], [GIB, GIB]) == [79, 1]
    assert split_layers(4, [0, 0, 0, 0], [1, 1, 1, 1]) == [1, 1, 1, 1]


def test_when_nothing_fits_layers_still_follow_the_proportions() -> None:
    counts = split_layers(80, [30 * GIB, 10 * GIB], [GIB, GIB])  # room for 40 of 80
    assert sum(counts) == 80 and counts == [60, 20]


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        split_layers(2, [1, 1, 1], [1, 1, 1])
