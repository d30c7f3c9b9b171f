"""evo.mutation: which kind is sampled, and that each kind does to a real (toy) member what its record says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evo.agent import AgentContext
from evo.mutation import MUTATIONS, apply_mutation, sample_mutation_kind
from evo.records import MutationRecord
from evo.spec import MutationSpec
from tests.toy_agent import ToyAgent

SPACE = ToyAgent.default_hparams()
ONLY = {kind: {k: (1.0 if k == kind else 0.0) for k in MutationSpec.KINDS} for kind in MutationSpec.KINDS}


def _toy() -> ToyAgent:
    hp = {k: v.value for k, v in SPACE.items()}
    return ToyAgent.create(ToyAgent.default_arch(), hp, seed=3, index=0, context=AgentContext(task=ToyAgent.validate_task({})))


def _weights(agent: ToyAgent) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in agent.net.state_dict().items()}


def test_the_registry_has_one_function_per_spec_kind() -> None:
    assert set(MUTATIONS) == set(MutationSpec.KINDS)


def test_kinds_are_sampled_by_relative_probability() -> None:
    spec = MutationSpec(no_mutation=2.0, architecture=0.0, parameters=1.0, activation=0.0, rl_hp=1.0)
    rng = np.random.default_rng(0)
    kinds = [sample_mutation_kind(spec, rng) for _ in range(4000)]
    share = {k: kinds.count(k) / len(kinds) for k in MutationSpec.KINDS}
    assert share["architecture"] == share["activation"] == 0.0  # probability 0: never
    assert abs(share["no_mutation"] - 0.5) < 0.03 and abs(share["parameters"] - 0.25) < 0.03


@pytest.mark.parametrize("kind", MutationSpec.KINDS)
def test_a_spec_with_one_kind_always_applies_that_kind(kind: str) -> None:
    spec = MutationSpec(**ONLY[kind], activation_choices=["ReLU", "GELU"])
    record = apply_mutation(_toy(), spec, SPACE, np.random.default_rng(0))
    assert record.kind == kind


def test_no_mutation_changes_nothing() -> None:
    agent = _toy()
    before, hp = _weights(agent), dict(agent.hparams)
    record = apply_mutation(agent, MutationSpec(**ONLY["no_mutation"]), SPACE, np.random.default_rng(0))
    assert record == MutationRecord(kind="no_mutation")
    assert all(torch.equal(before[k], v) for k, v in agent.net.state_dict().items()) and agent.hparams == hp


def test_rl_hp_changes_rl_hp_count_hyperparameters_and_records_old_and_new() -> None:
    agent = _toy()
    old = dict(agent.hparams)
    record = apply_mutation(agent, MutationSpec(**ONLY["rl_hp"], rl_hp_count=2), SPACE, np.random.default_rng(1))
    assert record.op == "hparams" and sorted(record.changes) == ["batch_size", "lr"]  # weight_decay is fixed
    for name, (before, after) in record.changes.items():
        assert before == old[name] and after == agent.hparams[name] and after != before
    assert agent.opt.param_groups[0]["lr"] == agent.hparams["lr"]  # pushed into the optimizer
    one = apply_mutation(_toy(), MutationSpec(**ONLY["rl_hp"]), SPACE, np.random.default_rng(1))
    assert len(one.changes) == 1



def test_rl_hp_resample_draws_hyperparameters_afresh_and_is_validated() -> None:
    spec = MutationSpec(**ONLY["rl_hp"], rl_hp_count=99, rl_hp_resample=1.0)
    grow_or_shrink = 0
    for seed in range(20):
        agent = _toy()
        record = apply_mutation(agent, spec, SPACE, np.random.default_rng(seed))
        before, after = record.changes["lr"]
        grow_or_shrink += round(after / before, 6) in (1.2, 0.8)
        assert SPACE["lr"].min <= after <= SPACE["lr"].max and agent.hparams["lr"] == after
    assert grow_or_shrink < 5  # drawn from the range, not stepped (a fresh draw lands on x1.2 or x0.8 by chance only)
    with pytest.raises(ValueError, match="rl_hp_resample"):
        MutationSpec(rl_hp_resample=1.5)

def test_parameters_adds_noise_of_the_spec_sd() -> None:
    small, large = _toy(), _toy()
    before = _weights(small)
    rec = apply_mutation(small, MutationSpec(**ONLY["parameters"], mutation_sd=0.01), SPACE, np.random.default_rng(0))
    apply_mutation(large, MutationSpec(**ONLY["parameters"], mutation_sd=0.1), SPACE, np.random.default_rng(0))
    assert rec.op == "weight_noise" and rec.details["sd"] == 0.01
    w = "blocks.0.fc.weight" if "blocks.0.fc.weight" in before else next(k for k, v in before.items() if v.dim() == 2)
    d_small = (small.net.state_dict()[w] - before[w]).abs().mean()
    d_large = (large.net.state_dict()[w] - before[w]).abs().mean()
    assert d_small > 0 and torch.isclose(d_large / d_small, torch.tensor(10.0), rtol=1e-3)


@pytest.mark.parametrize("new_layer, ops", [(1.0, {"add_block", "remove_block"}),
                                             (0.0, {"widen_trunk", "widen_block", "narrow_block"})])
def test_architecture_passes_the_spec_new_layer_probability(new_layer: float, ops: set[str]) -> None:
    """new_layer 1: always a layer operation; 0: always a node operation."""
    for seed in range(8):
        agent = _toy()
        record = apply_mutation(agent, MutationSpec(**ONLY["architecture"], new_layer=new_layer), SPACE,
                                np.random.default_rng(seed))
        assert record.kind == "architecture" and record.op in ops, record
        assert agent.arch["blocks"] == agent.net.arch()["blocks"]


def test_activation_picks_another_allowed_activation_and_records_it() -> None:
    seen = set()
    for seed in range(20):
        agent = _toy()  # its activation is Tanh
        spec = MutationSpec(**ONLY["activation"], activation_choices=["Tanh", "ReLU", "GELU"])
        record = apply_mutation(agent, spec, SPACE, np.random.default_rng(seed))
        new = agent.arch["activation"]
        assert record.op == "set_activation" and record.changes["activation"] == ["Tanh", new] and new != "Tanh"
        seen.add(new)
    assert seen == {"ReLU", "GELU"}


def test_activation_with_no_other_choice_is_a_recorded_no_op() -> None:
    agent = _toy()
    spec = MutationSpec(**ONLY["activation"], activation_choices=["Tanh"])
    record = apply_mutation(agent, spec, SPACE, np.random.default_rng(0))
    assert (record.op, record.kind, record.details) == ("none", "activation", {"reason": "no other activation allowed"})
    assert agent.arch["activation"] == "Tanh"


def test_an_agent_that_refuses_an_activation_keeps_its_own_record() -> None:
    class NoActivations(ToyAgent):
        def set_activation(self, name: str) -> MutationRecord:
            return MutationRecord.none("fixed activation")

    hp = {k: v.value for k, v in SPACE.items()}
    agent = NoActivations.create(ToyAgent.default_arch(), hp, 3, 0, AgentContext(task=ToyAgent.validate_task({})))
    record = apply_mutation(agent, MutationSpec(**ONLY["activation"], activation_choices=["ReLU"]), SPACE,
                            np.random.default_rng(0))
    assert (record.op, record.details, record.changes) == ("none", {"reason": "fixed activation"}, {})


def test_a_mutation_that_returns_no_record_is_an_error_naming_the_agent_and_kind() -> None:
    class Careless(ToyAgent):
        def mutate_architecture(self, rng, new_layer_prob):
            return {"op": "add_block"}  # a record's JSON, not a record

    hp = {k: v.value for k, v in SPACE.items()}
    agent = Careless.create(ToyAgent.default_arch(), hp, 3, 0, AgentContext(task=ToyAgent.validate_task({})))
    with pytest.raises(TypeError, match="^Careless: a architecture mutation must return a MutationRecord, found dict$"):
        apply_mutation(agent, MutationSpec(**ONLY["architecture"]), SPACE, np.random.default_rng(0))


def test_model_guided_mutation_moves_toward_what_gained_and_falls_back_without_data() -> None:
    pytest.importorskip("sklearn")
    space = ToyAgent.default_hparams()
    agent = ToyAgent.create(ToyAgent.default_arch(), {n: hp.value for n, hp in space.items()}, 0, 0, AgentContext())
    spec = MutationSpec(no_mutation=0, architecture=0, parameters=0, rl_hp=0, model_guided=1)
    rng = np.random.default_rng(0)
    # rounds gained most with lr near 1e-2 and batch_size near 100, whatever the round
    observations = []
    for r in range(6):
        for lr in (1e-4, 1e-3, 3e-3, 1e-2, 2.5e-2):
            for bs in (10, 60, 100):
                gain = -abs(np.log10(lr) + 2) - abs(bs - 100) / 100
                observations.append(({"lr": lr, "batch_size": bs, "weight_decay": 0.0}, r, gain))
    record = apply_mutation(agent, spec, space, rng, observations, round_=6)
    assert record.kind == "model_guided" and record.details["observations"] == len(observations)
    assert 3e-3 < agent.hparams["lr"] < 3e-2 and agent.hparams["batch_size"] >= 70
    assert isinstance(agent.hparams["batch_size"], int)
    fallback = apply_mutation(agent, spec, space, rng, observations[:2], round_=1)
    assert "fallback" in fallback.details and fallback.kind == "model_guided"
