"""`mutation.inference_search` (evo.inference): at every evaluation a member also tries the hyperparameters its
agent class names inference-only at × and ÷ `mutation.inference_factor`, on the same weights, and keeps the
best. Tested on the toy agent whose `sharpness` is read only by `evaluate` (best at 8), inline and on Ray,
and on the real ILQL agent, whose `inference_beta` it is for."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evo.agent import AgentContext
from evo.hparams import HParam
from evo.inference import InferenceSearch, candidates, search_at_evaluation
from evo.spec import SpecError, load_experiment
from tests.conftest import REPO, evolve_toy
from tests.toy_agent import DecodingToyAgent

ON = {"agent.kind": "tests.toy_agent:DecodingToyAgent", "mutation.inference_search": True}
# every child an unmutated copy: only the search at evaluation can move `sharpness`
COPIES = {"mutation.no_mutation": 1.0, "mutation.architecture": 0.0, "mutation.parameters": 0.0,
          "mutation.activation": 0.0, "mutation.rl_hp": 0.0}


def _toy(sharpness: float, search: InferenceSearch | None = None) -> DecodingToyAgent:
    hparams = {name: hp.value for name, hp in DecodingToyAgent.default_hparams().items()} | {"sharpness": sharpness}
    return DecodingToyAgent.create(DecodingToyAgent.default_arch(), hparams, 0, 0,
                                   AgentContext(task=DecodingToyAgent.validate_task({}), inference_search=search))


def test_candidates_step_each_inference_hparam_once_each_way_inside_its_range() -> None:
    space = {"beta": HParam(10.0, 0.5, 100.0, scale="log"), "k": HParam(4, 1, 8, kind="int"),
             "mode": HParam("a", kind="choice", choices=("a", "b", "c"))}
    search = InferenceSearch(space, 2.0)
    assert candidates(search, {"beta": 10.0, "k": 4, "mode": "a"}) == [
        {"beta": 20.0}, {"beta": 5.0}, {"k": 8}, {"k": 2}, {"mode": "b"}, {"mode": "c"}]
    # at a bound the step that leaves the range is clipped back onto the value itself, and dropped
    assert candidates(search, {"beta": 100.0, "k": 1, "mode": "c"}) == [
        {"beta": 50.0}, {"k": 2}, {"mode": "a"}, {"mode": "b"}]
    assert candidates(InferenceSearch({"beta": space["beta"]}, 4.0), {"beta": 80.0}) == [{"beta": 100.0}, {"beta": 20.0}]


def test_a_member_keeps_the_best_scoring_value_and_its_own_on_a_tie() -> None:
    search = InferenceSearch({"sharpness": DecodingToyAgent.default_hparams()["sharpness"]}, 2.0)
    agent = _toy(1.0)
    own = agent.evaluate()
    best = search_at_evaluation(agent, own, search)
    assert agent.hparams["sharpness"] == 2.0  # 2 is nearer 8 than 1 and 0.5 are
    assert best.fitness == pytest.approx(own.fitness + 9.0 - 4.0)
    assert best.fitness == agent.evaluate().fitness  # the result is the member as it is left
    assert best.metrics["inference_evaluations"] == 3.0 and best.metrics["inference_changed"] == 1.0
    assert best.metrics["val_mse"] == own.metrics["val_mse"]  # the agent's own metrics come with it

    at_best = _toy(8.0)
    own = at_best.evaluate()
    kept = search_at_evaluation(at_best, own, search)
    assert at_best.hparams["sharpness"] == 8.0 and kept.fitness == own.fitness
    assert kept.metrics["inference_changed"] == 0.0

    flat = _toy(2.0)  # a search whose every candidate ties keeps the member's own value
    flat.evaluate = lambda: type(own)(1.0, {})  # type: ignore[method-assign]
    assert search_at_evaluation(flat, flat.evaluate(), search).metrics["inference_changed"] == 0.0
    assert flat.hparams["sharpness"] == 2.0


@pytest.mark.parametrize("backend", ["inline", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_run_walks_an_inference_hparam_to_its_best_on_evaluations_alone(tmp_path: Path, backend: str) -> None:
    try:
        store = evolve_toy(tmp_path, {**ON, **COPIES, "population.generations": 4, "backend": backend}, backend=backend)
    finally:
        if backend == "ray":
            import ray

            ray.shutdown()
    # every founder starts at 1; each evaluation doubles it until 8, where both neighbours score lower
    for generation, (expected, changed) in enumerate([(2.0, 1.0), (4.0, 1.0), (8.0, 1.0), (8.0, 0.0)]):
        rows = store.evaluations(generation)
        assert len(rows) == 4
        assert {r["hparams"]["sharpness"] for r in rows} == {expected}
        assert {r["hparams"]["lr"] for r in rows} == {3e-3}  # nothing else moved
        assert {r["metrics"]["inference_evaluations"] for r in rows} == {3.0}
        assert {r["metrics"]["inference_changed"] for r in rows} == {changed}
        assert all(math.isfinite(r["fitness"]) for r in rows)


def test_without_the_switch_evaluation_is_the_members_own(tmp_path: Path) -> None:
    store = evolve_toy(tmp_path, {"agent.kind": "tests.toy_agent:DecodingToyAgent", **COPIES,
                                  "population.generations": 2})
    for generation in (0, 1):
        rows = store.evaluations(generation)
        assert {r["hparams"]["sharpness"] for r in rows} == {1.0}
        assert not any("inference_evaluations" in r["metrics"] for r in rows)


def test_the_switch_is_refused_for_an_agent_with_nothing_to_search() -> None:
    with pytest.raises(SpecError, match=r"mutation.inference_search.*'efficientzero' has no mutable inference-only"):
        load_experiment(REPO / "experiments" / "cartpole_efficientzero.toml", {"mutation.inference_search": True})
    with pytest.raises(SpecError, match=r"mutation.inference_search.*names \['inference_beta'\]; give one a range"):
        load_experiment(REPO / "experiments" / "randomwalks_ilql.toml",
                        {"mutation.inference_search": True,
                         "agent.hparams.inference_beta": {"value": 10.0, "min": 10.0, "max": 10.0}})
    with pytest.raises(SpecError, match="inference_factor"):
        load_experiment(REPO / "experiments" / "randomwalks_ilql.toml", {"mutation.inference_factor": 1.0})
    with pytest.raises(SpecError, match="mutation.inference_search: expected resources.fused = false"):
        load_experiment(REPO / "experiments" / "randomwalks_ilql.toml",
                        {"mutation.inference_search": True, "resources.fused": True})
    exp, _ = load_experiment(REPO / "experiments" / "randomwalks_ilql.toml", {"mutation.inference_search": True})
    assert exp.mutation.inference_search and exp.mutation.inference_factor == 2.0


def test_ilql_searches_its_decoding_beta_on_the_same_weights(one_torch_thread) -> None:
    from evo.inference import inference_search

    exp, _ = load_experiment(REPO / "experiments" / "randomwalks_ilql.toml", {"mutation.inference_search": True})
    search = inference_search(exp)
    assert search is not None and set(search.space) == {"inference_beta"}
    hparams = {name: hp.value for name, hp in exp.hparam_space.items()} | {"inference_beta": 1.0}
    agent = exp.agent_class.create(exp.arch, hparams, 0, 0, AgentContext(task=exp.task, seed=0, inference_search=search))
    agent.train(60)
    before = [p.detach().clone() for net in agent.networks().values() for p in net.parameters()]
    own = agent.evaluate()
    best = search_at_evaluation(agent, own, search)
    kept = agent.hparams["inference_beta"]
    assert agent.evaluate().fitness == best.fitness  # decoding is deterministic: the kept value scores as it did
    scores = {}
    for beta in (1.0, 2.0, 0.5):  # the member's own, then the candidates in the search's order
        agent.set_hparams({"inference_beta": beta})
        scores[beta] = agent.evaluate().fitness
    expected = 1.0
    for beta in (2.0, 0.5):  # a candidate wins only by scoring strictly higher
        expected = beta if scores[beta] > scores[expected] else expected
    assert kept == expected and best.fitness == scores[expected] >= own.fitness == scores[1.0]
    after = [p for net in agent.networks().values() for p in net.parameters()]
    assert all(a.equal(b) for a, b in zip(before, after, strict=True))  # evaluations only, no training


class LeakyToyAgent(DecodingToyAgent):
    """Names `lr` inference-only, which it is not: the agent contract must catch it."""

    inference_hparams = frozenset({"sharpness", "lr"})


def test_the_agent_contract_refuses_an_inference_hparam_that_changes_learning() -> None:
    from tests.contracts.test_toy_agent import TestDecodingToyAgent

    contract = TestDecodingToyAgent()
    contract.test_inference_hparams_change_how_it_acts_not_what_it_learns()  # sharpness alone: passes
    contract.agent_class = LeakyToyAgent
    with pytest.raises(AssertionError, match=r"\['lr', 'sharpness'\] apart"):
        contract.test_inference_hparams_change_how_it_acts_not_what_it_learns()
