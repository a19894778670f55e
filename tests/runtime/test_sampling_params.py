"""Validation and normalization of SamplingParams."""

import pytest

from graphllm.runtime.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.01}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -4}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),  # default max_tokens is 16
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": -1}, "logprobs"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
    ],
)
def test_invalid_parameter_raises_naming_it(kwargs, name):
    with pytest.raises(ValueError, match=name) as info:
        SamplingParams(**kwargs)
    bad_value = next(iter(kwargs.values())) if len(kwargs) == 1 else kwargs[name]
    assert repr(bad_value) in str(info.value)


def test_defaults_are_valid():
    p = SamplingParams()
    assert p.n == 1 and p.temperature == 1.0 and p.max_tokens == 16
    assert p.stop == [] and p.stop_token_ids == []
    assert not p.greedy


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"top_p": 1.0},
        {"top_p": 1e-3},
        {"top_k": -1},
        {"top_k": 0},
        {"top_k": 1},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"repetition_penalty": 1e-3},
        {"presence_penalty": 2.0, "frequency_penalty": -2.0},
        {"max_tokens": None, "min_tokens": 1000},
        {"max_tokens": 1, "min_tokens": 1},
        {"logprobs": 0},
        {"seed": 0},
    ],
)
def test_boundary_values_are_accepted(kwargs):
    params = SamplingParams(**kwargs)
    assert {k: getattr(params, k) for k in kwargs} == kwargs  # kept as given, not clamped


def test_stop_string_is_normalized_to_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_stop_list_is_copied():
    stops = ["a"]
    p = SamplingParams(stop=stops)
    stops.append("b")
    assert p.stop == ["a"]


def test_stop_token_ids_are_normalized_to_list():
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(stop_token_ids=(3, 7)).stop_token_ids == [3, 7]


def test_defaults_are_not_shared_between_instances():
    a, b = SamplingParams(), SamplingParams()
    a.stop.append("x")
    assert b.stop == []


@pytest.mark.parametrize(
    "temperature, greedy", [(0.0, True), (1e-6, True), (1e-4, False), (1.0, False)]
)
def test_greedy_property(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                                   "frequency_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field}.*finite"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field, value", [("max_tokens", "4"), ("max_tokens", 1.5), ("seed", "x"), ("top_k", 2.5),
                                          ("n", True), ("temperature", "1"), ("stop_token_ids", [-1]),
                                          ("stop_token_ids", [1.0])])
def test_fields_of_the_wrong_type_are_value_errors_naming_them(field, value):
    """Regression (s35's fuzzing): max_tokens=1.5 generated 2 tokens, "4" failed with a TypeError, seed="x" deep in
    the sampler; numpy's integers and floats still pass."""
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    import numpy as np
    assert SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.5)).max_tokens == 3
