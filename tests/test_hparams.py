import math

import numpy as np
import pytest

from evo.hparams import HParam, HParamError, mutate_hparams, parse_hparam


@pytest.mark.parametrize("hp", [
    HParam(3e-3, 1e-4, 1e-2, scale="log", resample_prob=0.3),
    HParam(0.5, 0.0, 1.0, grow=1.5, shrink=0.5),
    HParam(64, 16, 256, kind="int", resample_prob=0.1),
    HParam(5, 5, 6, kind="int"),
    HParam("adam", kind="choice", choices=("adam", "sgd", "rmsprop")),
])
def test_mutation_never_leaves_bounds(hp: HParam) -> None:
    rng = np.random.default_rng(0)
    value = hp.value
    for _ in range(2000):
        value = hp.with_value(value).mutate(rng)
        if hp.kind == "choice":
            assert value in hp.choices
        else:
            assert hp.min <= value <= hp.max
            if hp.kind == "int":
                assert isinstance(value, int)


def test_int_mutation_moves_even_when_rounding_would_stall() -> None:
    hp = HParam(2, 1, 10, kind="int", grow=1.2, shrink=0.8)
    rng = np.random.default_rng(1)
    assert {hp.mutate(rng) for _ in range(50)} == {1, 3}


def test_log_resample_covers_range_log_uniformly() -> None:
    hp = HParam(1e-3, 1e-5, 1e-1, scale="log", resample_prob=1.0)
    rng = np.random.default_rng(0)
    logs = np.log10([hp.mutate(rng) for _ in range(4000)])
    # log-uniform on [-5, -1]: about a quarter of the draws in each decade
    counts = np.histogram(logs, bins=[-5, -4, -3, -2, -1])[0] / len(logs)
    assert np.all(np.abs(counts - 0.25) < 0.04)


def test_fixed_hparam_is_never_mutated() -> None:
    rng = np.random.default_rng(0)
    space = {"gamma": HParam(0.99), "lr": HParam(1e-3, 1e-4, 1e-2)}
    for _ in range(20):
        changes = mutate_hparams(space, {"gamma": 0.99, "lr": 1e-3}, rng)
        assert "gamma" not in changes and set(changes) == {"lr"}


def test_seeded_mutation_is_deterministic() -> None:
    space = {"a": HParam(1.0, 0.1, 10.0, resample_prob=0.5), "b": HParam(8, 1, 64, kind="int")}
    seq = []
    for _ in range(2):
        rng = np.random.default_rng(42)
        vals = {"a": 1.0, "b": 8}
        out = []
        for _ in range(30):
            ch = mutate_hparams(space, vals, rng, n=2)
            vals.update({k: v[1] for k, v in ch.items()})
            out.append(dict(vals))
        seq.append(out)
    assert seq[0] == seq[1]


@pytest.mark.parametrize("raw, message", [
    ({"value": 1.0, "min": 2.0, "max": 1.0}, "min <= max"),
    ({"value": 5.0, "min": 0.0, "max": 1.0}, "within [0.0, 1.0]"),
    ({"value": 0.1, "min": 0.0, "max": 1.0, "scale": "log"}, "log-scale range needs min > 0"),
    ({"value": 1.0, "min": 0.0, "max": 2.0, "scale": "cubic"}, "scale"),
    ({"value": 1.0, "bogus": 1}, "unknown key"),
    ([1, 2], "found a list"),
])
def test_bad_ranges_are_refused_with_the_field(raw, message) -> None:
    with pytest.raises(HParamError, match="^lr: ") as exc:
        parse_hparam("lr", raw)
    assert message in str(exc.value)


def test_plain_value_keeps_agent_default_range() -> None:
    default = HParam(1e-3, 1e-5, 1e-1, scale="log")
    hp = parse_hparam("lr", 3e-3, default)
    assert hp.value == 3e-3 and hp.min == 1e-5 and hp.scale == "log" and hp.mutable
    assert math.isclose(parse_hparam("lr", {"value": 2e-3, "max": 5e-3}, default).max, 5e-3)
