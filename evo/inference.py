"""Searching inference-only hyperparameters at evaluation (`mutation.inference_search`).

Some hyperparameters change how a member acts, not what it learns: ILQL's `inference_beta` (the β of its
decoding) is read only when the member acts. A second value of such a hyperparameter costs one more
evaluation of the same weights, not another round of training, so a member can try its neighbours every
time it is evaluated and keep the best, where a mutation would spend a round of training on one guess.

An agent class names these in `Agent.inference_hparams`. With the switch on, after a member's own
evaluation each of them is evaluated at its value × and ÷ `mutation.inference_factor` (clipped to its
range; every choice of a choice-kind one), the others held, and the member keeps the value whose
evaluation scored highest (its own on a tie), with that evaluation as its result. Agents evaluate
deterministically (evo.agent's contract), so candidates are compared on the same draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evo.hparams import HParam

if TYPE_CHECKING:
    from evo.agent import Agent, Evaluation

__all__ = ["InferenceSearch", "searchable", "inference_search", "candidates", "search_at_evaluation"]


@dataclass(frozen=True)
class InferenceSearch:
    """What a member searches at evaluation: the ranges of its inference-only hyperparameters and the step."""

    space: dict[str, HParam]
    factor: float = 2.0


def searchable(agent_class: type[Agent], space: dict[str, HParam]) -> dict[str, HParam]:
    """The ranges of `space` that `agent_class` names inference-only and that can move: what the search tries."""
    return {name: hp for name, hp in space.items() if name in agent_class.inference_hparams and hp.mutable}


def inference_search(exp: Any) -> InferenceSearch | None:
    """The experiment's search at evaluation, or None when `mutation.inference_search` is off (evo.spec
    refuses it on when `searchable` finds nothing)."""
    if not exp.mutation.inference_search:
        return None
    return InferenceSearch(searchable(exp.agent_class, exp.hparam_space), exp.mutation.inference_factor)


def candidates(search: InferenceSearch, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The values to evaluate besides `values` (a member's hyperparameters): one hyperparameter changed
    at a time, each distinct and different from the member's own, in a fixed order."""
    out: list[dict[str, Any]] = []
    for name, hp in sorted(search.space.items()):
        current = values.get(name, hp.value)
        if hp.kind == "choice":
            options = [c for c in hp.choices if c != current]
        else:
            options = [hp.clip(float(current) * f) for f in (search.factor, 1.0 / search.factor)]
        seen = {current}
        for option in options:
            if option not in seen:
                seen.add(option)
                out.append({name: option})
    return out


def search_at_evaluation(agent: Agent, evaluation: Evaluation, search: InferenceSearch) -> Evaluation:
    """Evaluate `agent` at each candidate of `search`, leave it at the best-scoring values and return that
    evaluation; its metrics count the evaluations (`inference_evaluations`) and say whether a value
    changed (`inference_changed`, 0 or 1)."""
    best, best_values = evaluation, None
    own = {name: agent.hparams[name] for name in search.space if name in agent.hparams}
    options = candidates(search, own)
    for option in options:
        agent.set_hparams({**own, **option})
        trial = agent.evaluate()
        if math.isfinite(float(trial.fitness)) and float(trial.fitness) > float(best.fitness):
            best, best_values = trial, option
    agent.set_hparams({**own, **(best_values or {})})
    metrics = {**best.metrics, "inference_evaluations": float(1 + len(options)),
               "inference_changed": float(best_values is not None)}
    return type(best)(best.fitness, metrics)
