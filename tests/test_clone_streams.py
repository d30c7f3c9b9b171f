"""Every member explores (issue 15): a child made by `clone(index, seed)` trains on streams of its
own, while the elite's `clone(index)` keeps its stream — for every agent kind, reproducibly, and
alike on the inline and Ray backends.

The scenario: a member and two unmutated clones of it are trained one generation on the same
backend. The clones got new streams from `child_seed`, so all three must end as different
networks; an elite-style clone (`seed=None`) must end bit-identical to its parent (the digest
does catch twins); and the whole scenario repeated must give the same three networks to the bit.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import pytest
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from agents.ilql.agent import ILQLAgent
from evo.agent import Agent, AgentContext
from evo.diversity import float_leaves, measure_diversity, parameter_digest
from evo.replay import build_replay
from evo.rng import child_seed, member_seed
from evo.scheduler.inline import InlineScheduler
from tests.toy_agent import ToyAgent

RUN_SEED = 11


def _digest(agent: Agent) -> str:
    return parameter_digest(float_leaves(agent.get_state()))


def _toy() -> Agent:
    return ToyAgent.create(ToyAgent.default_arch(), {"lr": 3e-3, "batch_size": 16, "weight_decay": 0.0},
                           member_seed(RUN_SEED, 0), 0, AgentContext(task=ToyAgent.validate_task({"n_train": 128}),
                                                                     seed=RUN_SEED))


_ILQL_TASK = ILQLAgent.validate_task({"task": "randomwalks", "eval_samples": 1, "eval_bc": False})


def _ilql(arch: dict | None = None) -> Agent:
    # the run's shared store: read-only offline rows, drawn by key with each member's own RNG
    context = AgentContext(task=_ILQL_TASK, replay=build_replay(ILQLAgent.replay_spec(_ILQL_TASK), RUN_SEED, False),
                           seed=RUN_SEED)
    arch = ILQLAgent.validate_arch(arch or {"n_layer": 1, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64})
    return ILQLAgent.create(arch, {"batch_size": 16}, member_seed(RUN_SEED, 0), 0, context)


_EZ_TASK = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 1, "min_replay": 8, "replay_capacity": 2000,
            "segment_length": 4}  # short segments: rows reach the store, and updates start, within 24 steps
_EZ_ARCH = {"latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16, "proj_size": 16,
            "value_support": 10, "reward_support": 5}


def _ez_private_store(agent: Agent) -> None:
    """Give a member a store of its own. In a run, members pool into one store whose sampler stream
    they share (so they would differ anyway); alone, a member's data and draws come from its own
    streams only, which is exactly what this test is about."""
    task = EfficientZeroAgent.validate_task(_EZ_TASK)
    agent.context = AgentContext(task=task, replay=build_replay(EfficientZeroAgent.replay_spec(task), RUN_SEED, False),
                                 seed=RUN_SEED)


def _ez() -> Agent:
    agent = EfficientZeroAgent.create(_EZ_ARCH, {"num_simulations": 2, "batch_size": 8, "replay_ratio": 0.25,
                                                 "td_steps": 2, "num_unroll_steps": 2},
                                      member_seed(RUN_SEED, 0), 0, AgentContext(task=_EZ_TASK, seed=RUN_SEED))
    _ez_private_store(agent)
    return agent


KINDS: dict[str, tuple[Callable[[], Agent], int]] = {"toy": (_toy, 40), "ilql": (_ilql, 6), "efficientzero": (_ez, 24)}


def _family(make: Callable[[], Agent]) -> list[Agent]:
    """[parent, clone 4, clone 5, elite-style twin]: the clones born in generation 1 with their own streams."""
    parent = make()
    family = [parent, parent.clone(4, seed=child_seed(RUN_SEED, 4, 1)), parent.clone(5, seed=child_seed(RUN_SEED, 5, 1)),
              parent.clone(0)]
    if isinstance(parent, EfficientZeroAgent):
        for member in family[1:]:
            _ez_private_store(member)
    return family


def _trained_digests(kind: str) -> list[str]:
    """Digests of [the untrained parent, then the trained parent, clone 4, clone 5, twin]."""
    make, steps = KINDS[kind]
    family = _family(make)
    untrained = _digest(family[0])
    results = InlineScheduler(threads=1).run_generation(family, steps)
    return [untrained, *(_digest(r.agent) for r in results)]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unmutated_clones_explore_and_the_elite_keeps_its_stream(kind: str) -> None:
    untrained, parent, clone4, clone5, twin = _trained_digests(kind)
    assert parent != untrained, f"{kind}: training must change the weights, or this test proves nothing"
    for (i, a), (j, b) in combinations(enumerate([parent, clone4, clone5]), 2):
        assert a != b, f"{kind}: members {i} and {j} trained into bit-identical networks"
    assert twin == parent, f"{kind}: a clone that keeps its parent's streams must retrace it (the elite's case)"
    again = _trained_digests(kind)
    assert again == [untrained, parent, clone4, clone5, twin], f"{kind}: the same scenario must repeat to the bit"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_clone_copies_weights_optimizer_and_counters_exactly(kind: str) -> None:
    """Only the streams change: before training, a re-seeded clone has the parent's every float."""
    make, steps = KINDS[kind]
    parent = make()
    InlineScheduler(threads=1).run_generation([parent], steps)  # non-trivial optimizer state and counters
    child = parent.clone(9, seed=child_seed(RUN_SEED, 9, 2))
    assert _digest(child) == _digest(parent)
    assert _numpy_stream(parent) != _numpy_stream(child)


def _numpy_stream(agent: Agent) -> str:
    state = agent.get_state()
    return (state["rng"] if "rng" in state else state["ilql"]["rng"])["numpy"]


def test_ilql_dropout_draws_from_the_members_own_stream() -> None:
    """GPT-2 dropout samples torch's global stream; ILQL seeds it from the member's generator per
    step, so training is a function of the member's state alone (global RNG use elsewhere in the
    process — another member, a library — changes nothing)."""
    a = _ilql({"n_layer": 1, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64, "dropout": 0.2})
    b = a.clone(0)
    torch.manual_seed(1)
    a.train(3)
    torch.manual_seed(2)
    torch.rand(7)
    b.train(3)
    assert _digest(a) == _digest(b)
    c = a.clone(1, seed=child_seed(RUN_SEED, 1, 1))
    d = a.clone(0)
    c.train(2)
    d.train(2)
    assert _digest(c) != _digest(d)


def test_child_seeds_are_distinct_and_apart_from_founders() -> None:
    seeds = {child_seed(RUN_SEED, index, generation) for index in range(20) for generation in range(1, 6)}
    founders = {member_seed(RUN_SEED, index) for index in range(20)}
    assert len(seeds) == 100 and not seeds & founders
    assert child_seed(RUN_SEED, 4, 1) == child_seed(RUN_SEED, 4, 1) != child_seed(RUN_SEED + 1, 4, 1)


def test_measure_diversity_flags_identical_members() -> None:
    a, b = _toy(), _toy()
    b.train(5)
    twin = a.clone(3, seed=child_seed(RUN_SEED, 3, 1))  # new streams, same weights: still a twin
    d = measure_diversity({0: a.get_state(), 1: b.get_state(), 3: twin.get_state()})
    assert (d.members, d.distinct, d.identical) == (3, 2, [[0, 3]]) and d.collapsed
    assert "IDENTICAL: 0=3" in d.summary()
    assert 0 < d.mean_distance < 1


# ---- inline and Ray agree ------------------------------------------------------------------------
def _ray_digests(make: Callable[[], Agent], steps: int, replay=None) -> list[str]:
    from evo.scheduler.ray import RayScheduler

    family = _family(make)
    context = AgentContext(task=family[0].context.task, replay=replay, seed=RUN_SEED)
    scheduler = RayScheduler(type(family[0]), context, num_workers=2, cpus_per_member=1, timeout_s=600)
    try:
        return [_digest(r.agent) for r in scheduler.run_generation(family, steps)]
    finally:
        scheduler.close()


def test_ray_backend_trains_the_same_family_as_inline(ray_cluster) -> None:
    """Members travel to Ray actors as states, streams included: each ends as it does inline."""
    inline = _trained_digests("toy")[1:]
    assert _ray_digests(_toy, KINDS["toy"][1]) == inline
    assert len(set(inline[:3])) == 3


@pytest.mark.slow  # ILQL actors import transformers: minutes of wall time on a loaded 2-core machine
def test_ray_backend_trains_the_same_ilql_family_as_inline(ray_cluster) -> None:
    """ILQL draws its rows by key from the run's store: a Ray replay service on this backend."""
    from evo.scheduler.ray import RayScheduler

    service = RayScheduler.build_replay(ILQLAgent.replay_spec(_ILQL_TASK), RUN_SEED)
    try:
        assert _ray_digests(_ilql, KINDS["ilql"][1], replay=service) == _trained_digests("ilql")[1:]
    finally:
        service.stop()
