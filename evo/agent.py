"""The Agent protocol: the one seam between the evo engine and an RL algorithm.

The engine builds, trains, evaluates, clones, mutates, saves and exports members through these
methods alone, so it never needs to know what ILQL or EfficientZero do inside. An agent class
also *declares* what may evolve: its hyperparameters with their ranges (`default_hparams`) and
its architecture with bounds (`default_arch`); the experiment file may override both.

`TorchAgent` supplies the parts that are the same for every PyTorch agent: cloning through the
state, Gaussian weight noise, applying lr / weight decay to optimizers, RNG bookkeeping and the
export directory that `evo.load` reads back.

This module is the engine's side of the seam: agent implementations (agents/, or a user's own
package) import it; it imports no agent.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from evo.checkpoint import load_state, save_state
from evo.hparams import HParam
from evo.inference import InferenceSearch
from evo.records import MutationRecord
from evo.replay.protocol import Replay, ReplaySpec
from evo.rng import new_streams, restore_streams, streams_state

__all__ = ["Agent", "TorchAgent", "AgentContext", "Evaluation", "EXPORT_CONFIG", "clone_tree"]

EXPORT_CONFIG = "config.json"
EXPORT_STATE_DIR = "agent"


@dataclass
class Evaluation:
    """The result of evaluating a member: `fitness` (higher is better) plus named metrics."""

    fitness: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AgentContext:
    """What members of one run share: the task settings, the run seed and the shared replay store.

    `replay` is the store the run built from the agent class's `replay_spec` (in this process or
    a Ray actor; members cannot tell), or None for agents that need none and for exported agents
    loaded outside a run. `own_share` is the experiment's `replay.own_share`: the least share of a
    member's batches drawn from its own rows of the generation (its view's, evo.replay.view);
    `own_rows` is `replay.own_rows`: "line" makes those own rows the member's line store, kept
    across generations and copied to its clones. `inference_search` is `mutation.inference_search`'s
    ranges and step (evo.inference.InferenceSearch), None when it is off.
    """

    task: dict[str, Any] = field(default_factory=dict)
    replay: Replay | None = None
    device: str = "cpu"
    seed: int = 0
    own_share: float = 0.0
    own_rows: str = "generation"
    inference_search: InferenceSearch | None = None


class Agent(ABC):
    """One member of a population. See docs/architecture.md for the full contract."""

    kind: ClassVar[str] = ""
    # hyperparameters that change how a member acts, not what it learns (ILQL's inference_beta): another
    # value costs an evaluation, not training (evo.inference, `mutation.inference_search`)
    inference_hparams: ClassVar[frozenset[str]] = frozenset()
    index: int
    arch: dict[str, Any]
    hparams: dict[str, Any]

    # ---- declarations ---------------------------------------------------------------------
    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        """Every hyperparameter the agent accepts, with its default value and mutable range."""
        return {}

    @classmethod
    def default_arch(cls) -> dict[str, Any]:
        """Every architecture knob the agent accepts, with defaults and mutation bounds."""
        return {}

    @classmethod
    def reward_threshold(cls, task: dict[str, Any]) -> float | None:
        """The score at which `task` counts as solved (what `population.stop_at_score = "task"`
        stops a run at), or None if the agent knows none."""
        return None

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        """Check the experiment's [agent.task] table; raise ValueError('task.FIELD: expected …, found …')."""
        return dict(task)

    @classmethod
    def validate_arch(cls, arch: dict[str, Any]) -> dict[str, Any]:
        """Check [agent.arch] against `default_arch`; unknown keys are refused."""
        defaults = cls.default_arch()
        unknown = sorted(set(arch) - set(defaults))
        if unknown:
            raise ValueError(f"arch.{unknown[0]}: unknown architecture key; expected some of {sorted(defaults)}")
        return {**defaults, **arch}

    @classmethod
    def replay_spec(cls, task: dict[str, Any]) -> ReplaySpec | None:
        """What the run's shared replay store must hold (schema, capacity, sampler, offline rows);
        None if the agent needs none. The run decides where the store lives."""
        return None

    # ---- lifecycle --------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def create(cls, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
               context: AgentContext) -> Agent:
        """A fresh member from an architecture, hyperparameter values and a seed."""

    @abstractmethod
    def train(self, steps: int) -> dict[str, float]:
        """Train for `steps` of the agent's own unit; returns named metrics (e.g. loss terms)."""

    @abstractmethod
    def evaluate(self) -> Evaluation:
        """Fitness (higher is better) and named metrics."""

    @abstractmethod
    def clone(self, index: int, seed: int | None = None) -> Agent:
        """An independent copy under a new index: weights, optimizer state and counters, exactly.

        `seed=None` copies the random streams too (the surviving elite keeps its own); an int
        re-derives *every* random stream the member draws from (torch, numpy and any of its own,
        such as replay draws or environment seeds) from that seed, so a child explores on its own
        instead of replaying its parent's training draw for draw.
        """

    @abstractmethod
    def set_hparams(self, values: dict[str, Any]) -> None:
        """Adopt new hyperparameter values (e.g. push lr into the optimizer)."""

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        """One architecture change, drawn with `rng`. Default: the agent has none."""
        return MutationRecord.none(f"{type(self).__name__} has no architecture mutations")

    def perturb_parameters(self, rng: np.random.Generator, sd: float) -> MutationRecord:
        """Noise on the weights, drawn with `rng`. Default: the agent has none."""
        return MutationRecord.none(f"{type(self).__name__} has no parameter mutation")

    def set_activation(self, name: str) -> MutationRecord:
        """Switch the networks' activation to `name`. Default: the agent has none."""
        return MutationRecord.none(f"{type(self).__name__} has no activation mutation")

    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """Everything needed to resume exactly: tensors, numpy arrays and JSON scalars only."""

    @classmethod
    @abstractmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> Agent:
        """Rebuild a member from `get_state()` output."""

    # ---- export ---------------------------------------------------------------------------
    def export(self, out_dir: str | Path, info: dict[str, Any] | None = None) -> Path:
        """Write a self-contained directory that `evo.load(out_dir)` rebuilds the agent from.

        Layout: `agent/` (tensors.safetensors + state.json), `config.json` (kind, class, arch,
        hyperparameters, task) and `README.md` (a short model card).
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_state(out / EXPORT_STATE_DIR, self.get_state())
        cls = type(self)
        config = {
            "kind": self.kind,
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "index": self.index,
            "arch": self.arch,
            "hparams": self.hparams,
            "task": getattr(self, "context", AgentContext()).task,
            # evaluation seeds derive from the run seed: an export evaluates as it did in the run
            "seed": getattr(self, "context", AgentContext()).seed,
            "info": info or {},
        }
        (out / EXPORT_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
        (out / "README.md").write_text(_model_card(config))
        return out

    @classmethod
    def load_export(cls, directory: str | Path) -> Agent:
        directory = Path(directory)
        config = json.loads((directory / EXPORT_CONFIG).read_text())
        state, _ = load_state(directory / EXPORT_STATE_DIR)
        return cls.from_state(state, AgentContext(task=config.get("task", {}), seed=int(config.get("seed", 0))))


def _model_card(config: dict[str, Any]) -> str:
    info = config.get("info", {})
    lines = [
        f"# evo {config['kind']} agent (member {config['index']})",
        "",
        f"Exported by evo from run `{info.get('run', '?')}`, generation {info.get('generation', '?')}.",
        f"Fitness: {info.get('fitness', '?')}.",
        "",
        "Load it with:",
        "",
        "```python",
        "import evo",
        "agent = evo.load('THIS_DIRECTORY')",
        "```",
        "",
        "## Architecture",
        "```json",
        json.dumps(config["arch"], indent=2, sort_keys=True, default=str),
        "```",
        "## Hyperparameters",
        "```json",
        json.dumps(config["hparams"], indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


def clone_tree(obj: Any) -> Any:
    """Deep-copy a state tree so no tensor or array is shared with the original."""
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clone_tree(v) for v in obj]
    return obj


class TorchAgent(Agent):
    """An Agent built from torch modules and optimizers, with the shared parts implemented.

    Subclasses implement `create`, `train`, `evaluate`, `get_state`, `from_state`, and list
    their modules in `networks()` (perturbed by parameter mutation) and optimizers in
    `optimizers()` (receive lr / weight_decay changes). They keep `self.generator`
    (torch) and `self.rng` (numpy) as their only sources of randomness, saved with
    `rng_state()`, restored with `restore_rng()` and re-seeded with `init_rng()` (which
    `clone(index, seed)` calls: a subclass with streams of its own overrides it to re-seed them all).
    """

    context: AgentContext
    generator: torch.Generator
    rng: np.random.Generator

    #: hyperparameters pushed into every optimizer param group when they change
    OPTIMIZER_HPARAMS: ClassVar[tuple[str, ...]] = ("lr", "weight_decay")

    def networks(self) -> dict[str, nn.Module]:
        return {}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def init_rng(self, seed: int) -> None:
        """(Re)seed every random stream of the member from `seed`."""
        self.generator, self.rng = new_streams(seed)

    def rng_state(self) -> dict[str, Any]:
        return streams_state(self.generator, self.rng)

    def restore_rng(self, state: dict[str, Any]) -> None:
        self.generator, self.rng = restore_streams(state)

    def clone(self, index: int, seed: int | None = None) -> TorchAgent:
        state = clone_tree(self.get_state())
        twin = type(self).from_state(state, self.context)
        twin.index = index
        if seed is not None:
            twin.init_rng(seed)
        return twin

    def set_hparams(self, values: dict[str, Any]) -> None:
        self.hparams.update(values)
        for opt in self.optimizers():
            for group in opt.param_groups:
                for name in self.OPTIMIZER_HPARAMS:
                    if name in values:
                        group[name] = values[name]

    def perturb_parameters(self, rng: np.random.Generator, sd: float) -> MutationRecord:
        """Gaussian noise on every weight matrix, N(0, sd · rms(W)): relative, so sd means the same at any scale."""
        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        count = 0
        with torch.no_grad():
            for net in self.networks().values():
                for p in net.parameters():
                    if p.dim() < 2 or not p.is_floating_point():
                        continue
                    rms = p.pow(2).mean().sqrt().clamp_min(1e-8)
                    noise = torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
                    p.add_(noise * (sd * rms))
                    count += p.numel()
        return MutationRecord(op="weight_noise", function_preserving=False, details={"sd": sd, "perturbed": count})
