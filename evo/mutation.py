"""Mutation kinds and their registry: one kind is sampled per child by relative probability.

Each mutation changes an agent in place and returns a `MutationRecord` of what changed; the run
store keeps it as the child's lineage entry.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from evo.agent import Agent
from evo.hparams import HParam, mutate_hparams
from evo.records import MutationRecord
from evo.spec import MutationSpec

__all__ = ["MUTATIONS", "sample_mutation_kind", "apply_mutation", "Observation"]

Mutation = Callable[[Agent, MutationSpec, dict[str, HParam], np.random.Generator], MutationRecord]


def _none(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> MutationRecord:
    return MutationRecord()


def _architecture(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> MutationRecord:
    return agent.mutate_architecture(rng, spec.new_layer)


def _parameters(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> MutationRecord:
    return agent.perturb_parameters(rng, spec.mutation_sd)


def _activation(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> MutationRecord:
    current = agent.arch.get("activation")
    options = [a for a in spec.activation_choices if a != current]
    if not options:
        return MutationRecord.none("no other activation allowed")
    name = options[int(rng.integers(len(options)))]
    record = agent.set_activation(name)
    if record.op == "none":
        return record
    return replace(record, op="set_activation", changes={"activation": [current, name], **record.changes})


def _rl_hp(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> MutationRecord:
    changes = mutate_hparams(space, agent.hparams, rng, spec.rl_hp_count, spec.rl_hp_resample)
    agent.set_hparams({k: new for k, (_, new) in changes.items()})
    return MutationRecord(op="hparams", changes={k: [old, new] for k, (old, new) in changes.items()})


# what the model-guided kind learns from: (the member's hyperparameters during a round, the round,
# the change of its line's score over that round)
Observation = tuple[dict[str, Any], int, float]


def _model_guided(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator,
                  observations: Sequence[Observation] = (), round_: int = 0) -> MutationRecord:
    """PB2's idea (Parker-Holder et al. 2020): a Gaussian process (scikit-learn) models the score
    gain of a round from (numeric mutable hyperparameters scaled to [0, 1], log ranges in log
    space; the round), and the child takes, among 512 candidates drawn in the box, the values with
    the highest upper confidence bound mean + 2·sd at the current round. With fewer than 4
    observations it falls back to an rl_hp mutation (said in the record)."""
    names = [n for n, hp in space.items() if hp.mutable and hp.kind in ("float", "int")]
    usable = [(h, r, g) for h, r, g in observations if all(n in h for n in names) and math.isfinite(g)]
    # in a canonical order: a resumed run (which reads them back from the run store) fits the same model
    usable.sort(key=lambda o: (o[1], [float(o[0][n]) for n in names], o[2]))
    if not names or len(usable) < 4:
        record = _rl_hp(agent, spec, space, rng)
        return replace(record, details={**record.details, "fallback": f"{len(usable)} observations (4 needed)"})
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    rounds = max(max(r for _, r, _ in usable), round_, 1)
    x = np.array([[_unit(space[n], h[n]) for n in names] + [r / rounds] for h, r, _ in usable])
    y = np.array([g for _, _, g in usable], dtype=float)
    kernel = ConstantKernel(1.0) * Matern(length_scale=np.ones(len(names) + 1), nu=2.5) + WhiteKernel(0.1)
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, n_restarts_optimizer=0,
                                  random_state=int(rng.integers(2**31)))
    with warnings.catch_warnings():  # few points: the optimiser may stop at a bound, which is fine here
        warnings.simplefilter("ignore")
        gp.fit(x, y)
    candidates = rng.random((512, len(names)))
    candidates[0] = [_unit(space[n], agent.hparams[n]) for n in names]  # keeping the values is a candidate
    mean, sd = gp.predict(np.column_stack([candidates, np.full(len(candidates), round_ / rounds)]), return_std=True)
    best = int(np.argmax(mean + 2.0 * sd))
    new = {n: _from_unit(space[n], candidates[best][i]) for i, n in enumerate(names)}
    changes = {n: [agent.hparams[n], v] for n, v in new.items() if v != agent.hparams[n]}
    agent.set_hparams({n: v for n, (_, v) in changes.items()})
    return MutationRecord(op="hparams", changes=changes,
                          details={"observations": len(usable), "ucb": float(mean[best] + 2.0 * sd[best])})


def _unit(hp: HParam, value: Any) -> float:
    lo, hi, v = float(hp.min), float(hp.max), float(value)
    if hp.scale == "log":
        lo, hi, v = math.log(lo), math.log(hi), math.log(max(v, 1e-300))
    return 0.0 if hi == lo else min(1.0, max(0.0, (v - lo) / (hi - lo)))


def _from_unit(hp: HParam, u: float) -> Any:
    lo, hi = float(hp.min), float(hp.max)
    v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if hp.scale == "log" else lo + u * (hi - lo)
    v = min(hi, max(lo, v))
    return int(round(v)) if hp.kind == "int" else float(v)


MUTATIONS: dict[str, Mutation] = {
    "no_mutation": _none,
    "architecture": _architecture,
    "parameters": _parameters,
    "activation": _activation,
    "rl_hp": _rl_hp,
    "model_guided": _model_guided,  # apply_mutation passes it the run's observations
}


def sample_mutation_kind(spec: MutationSpec, rng: np.random.Generator) -> str:
    weights = spec.weights()
    return MutationSpec.KINDS[int(rng.choice(len(weights), p=weights / weights.sum()))]


def apply_mutation(agent: Agent, spec: MutationSpec, space: dict[str, HParam],
                   rng: np.random.Generator, observations: Sequence[Observation] = (), round_: int = 0) -> MutationRecord:
    """Sample a kind, apply it to `agent` in place, and return its record (with `kind` set).
    `observations` and `round_` feed the model-guided kind (the run's (hyperparameters, round,
    score gain) so far, and the round the child starts)."""
    kind = sample_mutation_kind(spec, rng)
    if kind == "model_guided":
        record = _model_guided(agent, spec, space, rng, observations, round_)
    else:
        record = MUTATIONS[kind](agent, spec, space, rng)
    if not isinstance(record, MutationRecord):
        raise TypeError(f"{type(agent).__name__}: a {kind} mutation must return a MutationRecord, "
                        f"found {type(record).__name__}")
    return replace(record, kind=kind)
