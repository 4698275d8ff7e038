"""SamplingParams at the edge: ranges are checked, and temperatures too small to divide by
mean greedy."""

import pytest

from daemon.runtime.errors import RequestError
from daemon.runtime.sampling.params import MIN_TEMPERATURE, SamplingParams


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 1.2249270320809242e-154, 9.9e-6])
def test_temperatures_below_the_minimum_are_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    assert params.is_greedy and params.temperature == 0.0


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-3, 0.7, 100.0])
def test_other_temperatures_sample(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    assert not params.is_greedy and params.temperature == temperature


@pytest.mark.parametrize("temperature", [-1e-300, -1.0, 100.5, float("nan"), float("inf")])
def test_out_of_range_temperatures_are_refused(temperature: float) -> None:
    with pytest.raises(RequestError, match="temperature must be in"):
        SamplingParams(temperature=temperature)
