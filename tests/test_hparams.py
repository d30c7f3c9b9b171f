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


# ---- construction: every refusal names the field and says what was expected and found --------------

@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "bogus"}, "kind: expected one of ['float', 'int', 'choice'], found 'bogus'"),
    ({"scale": "cubic"}, "scale: expected one of ['linear', 'log'], found 'cubic'"),
    ({"resample_prob": 1.5}, "resample_prob: expected a probability in [0, 1], found 1.5"),
    ({"resample_prob": -0.1}, "resample_prob: expected a probability in [0, 1], found -0.1"),
    ({"kind": "choice"}, "choices: expected a non-empty list for kind 'choice'"),
    ({"kind": "choice", "choices": ("a", "b")}, "value: expected one of ['a', 'b'], found 1.0"),
    ({"min": 0.0}, "min/max: give both bounds or neither"),
    ({"min": -math.inf, "max": 2.0}, "min: expected a finite number, found -inf"),
    ({"min": 0.0, "max": math.nan}, "max: expected a finite number, found nan"),
    ({"min": True, "max": 2.0}, "min: expected a finite number, found True"),
    ({"min": "0", "max": 2.0}, "min: expected a finite number, found '0'"),
    ({"kind": "int", "value": 2.5, "min": 0, "max": 5}, "value: expected an integer, found 2.5"),
    ({"min": 2.0, "max": 0.5}, "min/max: expected min <= max, found min=2.0 > max=0.5"),
    ({"min": 0.0, "max": 2.0, "scale": "log"}, "min: a log-scale range needs min > 0, found 0.0"),
    ({"grow": 0.9}, "grow/shrink: expected grow >= 1 and 0 < shrink <= 1, found 0.9/0.8"),
    ({"shrink": 0.0}, "grow/shrink: expected grow >= 1 and 0 < shrink <= 1, found 1.2/0.0"),
    ({"shrink": 1.5}, "grow/shrink: expected grow >= 1 and 0 < shrink <= 1, found 1.2/1.5"),
])
def test_an_impossible_range_is_refused_with_the_field(kwargs, message) -> None:
    with pytest.raises(HParamError) as exc:
        HParam(**{"value": 1.0, **kwargs})
    assert str(exc.value) == message


def test_boundary_ranges_are_accepted() -> None:
    """min == max is a fixed value; grow 1 and shrink 1 are the identity factors; resample_prob 0 and 1 are allowed."""
    fixed = HParam(5, 5, 5, kind="int")
    assert not fixed.mutable and fixed.mutate(np.random.default_rng(0)) == 5
    HParam(1.0, 0.5, 2.0, grow=1.0, shrink=1.0, resample_prob=1.0)
    HParam(1.0, 0.5, 2.0, resample_prob=0.0)


# ---- mutation ---------------------------------------------------------------------------------------

def test_a_float_moves_by_exactly_the_drawn_factor() -> None:
    """1.0 × 1.2 rounds back to 1: a float must still move (the step-by-one rule is for ints only)."""
    hp = HParam(1.0, 0.1, 10.0, grow=1.2, shrink=0.6)
    rng = np.random.default_rng(0)
    assert {hp.mutate(rng) for _ in range(50)} == {1.2, 0.6}


@pytest.mark.parametrize("hp", [
    HParam(1.0, 0.1, 10.0, grow=1.5, shrink=0.5),
    HParam(2, 0, 10, kind="int", grow=1.2, shrink=0.8),   # rounds back to 2 both ways: steps by one
    HParam(5, 0, 10, kind="int", grow=1.0, shrink=0.5),  # a grow factor of 1 still steps up
])
def test_a_grow_draw_moves_up_and_a_shrink_draw_down(hp: HParam) -> None:
    """The second draw of `mutate` (after the resample check) picks grow (< 0.5) or shrink."""
    for seed in range(30):
        twin = np.random.default_rng(seed)
        twin.random()
        grows = twin.random() < 0.5
        new = hp.mutate(np.random.default_rng(seed))
        assert (new > hp.value) if grows else (new < hp.value), (seed, grows, new)


def test_an_int_that_rounds_back_steps_by_exactly_one() -> None:
    hp = HParam(2, 0, 10, kind="int", grow=1.2, shrink=0.8)
    rng = np.random.default_rng(1)
    assert {hp.mutate(rng) for _ in range(50)} == {1, 3}


def test_a_choice_always_moves_to_another_choice() -> None:
    hp = HParam("adam", kind="choice", choices=("adam", "sgd", "rmsprop"))
    rng = np.random.default_rng(0)
    assert {hp.mutate(rng) for _ in range(60)} == {"sgd", "rmsprop"}
    assert HParam("only", kind="choice", choices=("only",)).mutate(rng) == "only"


def test_resampling_a_choice_draws_from_all_choices() -> None:
    hp = HParam("adam", kind="choice", choices=("adam", "sgd", "rmsprop"), resample_prob=1.0)
    rng = np.random.default_rng(0)
    assert {hp.mutate(rng) for _ in range(60)} == {"adam", "sgd", "rmsprop"}


def test_mutate_hparams_changes_one_by_default_and_each_at_most_once() -> None:
    space = {"a": HParam(1.0, 0.1, 10.0), "b": HParam(8, 1, 64, kind="int"), "c": HParam(0.5, 0.0, 1.0),
             "fixed": HParam(0.99)}
    values = {"a": 1.0, "b": 8, "c": 0.5, "fixed": 0.99}
    for seed in range(20):
        assert len(mutate_hparams(space, values, np.random.default_rng(seed))) == 1
        every = mutate_hparams(space, values, np.random.default_rng(seed), n=5)
        assert sorted(every) == ["a", "b", "c"]  # n is capped at the mutable ones, each drawn once
        for name, (old, new) in every.items():
            assert old == values[name] and new != old and space[name].min <= new <= space[name].max
    assert mutate_hparams({"fixed": HParam(0.99)}, {"fixed": 0.99}, np.random.default_rng(0)) == {}



def test_a_resample_floor_draws_from_the_whole_range_and_keeps_a_higher_own_probability() -> None:
    space = {"lr": HParam(1e-3, 1e-5, 1e-1, scale="log"), "b": HParam(8, 1, 64, kind="int", resample_prob=1.0)}
    values = {"lr": 1e-3, "b": 8}
    steps = {round(new / old, 6) for seed in range(200)
             for old, new in [mutate_hparams(space, values, np.random.default_rng(seed), n=2)["lr"]]}
    assert steps == {1.2, 0.8}  # no floor: lr only grows or shrinks
    floored = [mutate_hparams(space, values, np.random.default_rng(seed), n=2, resample_prob=1.0) for seed in range(200)]
    lrs = np.log10([c["lr"][1] for c in floored])
    assert lrs.min() < -4 and lrs.max() > -2  # drawn afresh from the log range, far past one x1.2 or x0.8 step
    # the draws are the same with or without a floor: at 0 it is the mutation it was, and a hyperparameter
    # whose own probability is higher (b: 1.0) gets the same values whatever the floor
    assert [c["b"] for c in floored] == [mutate_hparams(space, values, np.random.default_rng(seed), n=2)["b"]
                                         for seed in range(200)]
    with pytest.raises(HParamError, match="resample_prob"):
        mutate_hparams(space, values, np.random.default_rng(0), resample_prob=1.5)

# ---- parsing experiment-file entries ----------------------------------------------------------------

def test_to_json_is_plain_json() -> None:
    assert HParam("a", kind="choice", choices=("a", "b")).to_json() == {
        "value": "a", "min": None, "max": None, "scale": "linear", "kind": "choice", "choices": ["a", "b"],
        "grow": 1.2, "shrink": 0.8, "resample_prob": 0.0}


@pytest.mark.parametrize("raw, kind, choices", [
    (3, "int", None),
    (0.5, "float", None),
    (True, "choice", (True,)),
    ("adam", "choice", ("adam",)),
])
def test_a_plain_value_without_a_default_is_fixed_with_its_kind(raw, kind, choices) -> None:
    hp = parse_hparam("x", raw)
    assert (hp.value, hp.kind, hp.choices, hp.min, hp.max) == (raw, kind, choices, None, None)
    assert type(hp.value) is type(raw)


def test_a_table_with_choices_is_a_choice_with_a_tuple_of_choices() -> None:
    hp = parse_hparam("opt", {"value": "sgd", "choices": ["adam", "sgd"]})
    assert hp.kind == "choice" and hp.choices == ("adam", "sgd") and hp.mutable
    hash(hp)  # frozen and hashable: the choices are a tuple, not a list


def test_a_table_keeps_the_defaults_kind_unless_it_names_one() -> None:
    default = HParam(64, 16, 256, kind="int")
    assert parse_hparam("width", {"value": 32, "max": 128}, default).kind == "int"
    named = parse_hparam("width", {"value": 0.5, "min": 0.0, "max": 1.0, "kind": "float"}, default)
    assert named.kind == "float" and named.value == 0.5


@pytest.mark.parametrize("raw, default, message", [
    ({"min": 0.0, "max": 1.0}, None, "lr: value: expected a starting value"),
    (True, HParam(1e-3, 1e-4, 1e-2), "lr: expected a value like 0.001, found True"),
    (0.5, HParam(False), "lr: expected a value like False, found 0.5"),
    ({"value": "fast", "min": 0.0, "max": 1.0}, None, "lr: '<=' not supported between instances of 'float' and 'str'"),
])
def test_bad_entries_name_the_hyperparameter(raw, default, message) -> None:
    with pytest.raises(HParamError) as exc:
        parse_hparam("lr", raw, default)
    assert str(exc.value) == message
