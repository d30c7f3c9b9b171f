"""Mutation kinds and their registry: one kind is sampled per child by relative probability.

Each mutation changes an agent in place and returns a small JSON record of what changed; the
run store keeps the record as the child's lineage entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from agents.base import Agent
from evo.hparams import HParam, mutate_hparams
from evo.spec import MutationSpec

__all__ = ["MUTATIONS", "sample_mutation_kind", "apply_mutation"]

Mutation = Callable[[Agent, MutationSpec, dict[str, HParam], np.random.Generator], dict[str, Any]]


def _none(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> dict[str, Any]:
    return {}


def _architecture(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> dict[str, Any]:
    return agent.mutate_architecture(rng, spec.new_layer)


def _parameters(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> dict[str, Any]:
    return agent.perturb_parameters(rng, spec.mutation_sd)


def _activation(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> dict[str, Any]:
    current = agent.arch.get("activation")
    options = [a for a in spec.activation_choices if a != current]
    if not options:
        return {"op": "none", "reason": "no other activation allowed"}
    name = options[int(rng.integers(len(options)))]
    record = agent.set_activation(name)
    return {"from": current, "to": name, **record}


def _rl_hp(agent: Agent, spec: MutationSpec, space: dict[str, HParam], rng: np.random.Generator) -> dict[str, Any]:
    changes = mutate_hparams(space, agent.hparams, rng, spec.rl_hp_count)
    agent.set_hparams({k: new for k, (_, new) in changes.items()})
    return {"changes": {k: [old, new] for k, (old, new) in changes.items()}}


MUTATIONS: dict[str, Mutation] = {
    "no_mutation": _none,
    "architecture": _architecture,
    "parameters": _parameters,
    "activation": _activation,
    "rl_hp": _rl_hp,
}


def sample_mutation_kind(spec: MutationSpec, rng: np.random.Generator) -> str:
    weights = spec.weights()
    return MutationSpec.KINDS[int(rng.choice(len(weights), p=weights / weights.sum()))]


def apply_mutation(agent: Agent, spec: MutationSpec, space: dict[str, HParam],
                   rng: np.random.Generator) -> dict[str, Any]:
    """Sample a kind, apply it to `agent` in place, and return {"kind": ..., **record}."""
    kind = sample_mutation_kind(spec, rng)
    return {"kind": kind, **MUTATIONS[kind](agent, spec, space, rng)}
