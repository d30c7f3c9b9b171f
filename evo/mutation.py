"""Mutation kinds and their registry: one kind is sampled per child by relative probability.

Each mutation changes an agent in place and returns a `MutationRecord` of what changed; the run
store keeps it as the child's lineage entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from evo.agent import Agent
from evo.hparams import HParam, mutate_hparams
from evo.records import MutationRecord
from evo.spec import MutationSpec

__all__ = ["MUTATIONS", "sample_mutation_kind", "apply_mutation"]

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
    changes = mutate_hparams(space, agent.hparams, rng, spec.rl_hp_count)
    agent.set_hparams({k: new for k, (_, new) in changes.items()})
    return MutationRecord(op="hparams", changes={k: [old, new] for k, (old, new) in changes.items()})


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
                   rng: np.random.Generator) -> MutationRecord:
    """Sample a kind, apply it to `agent` in place, and return its record (with `kind` set)."""
    kind = sample_mutation_kind(spec, rng)
    record = MUTATIONS[kind](agent, spec, space, rng)
    if not isinstance(record, MutationRecord):
        raise TypeError(f"{type(agent).__name__}: a {kind} mutation must return a MutationRecord, "
                        f"found {type(record).__name__}")
    return replace(record, kind=kind)
