"""A small, real agent used only by the engine's tests (not a product feature).

It fits y = sin(3x₀) + x₁² with an EvolvableMLP and Adam; fitness is minus the validation MSE.
Everything the engine touches is real: training changes weights, hyperparameters change the
optimizer, architecture mutations resize the network and carry Adam's state, and the full state
(weights, optimizer, RNG) round-trips through safetensors.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import torch

from evo.agent import AgentContext, Evaluation, TorchAgent
from evo.evolvable import EvolvableMLP, load_optimizer_state, optimizer_state, remap_optimizer
from evo.hparams import HParam
from evo.records import MutationRecord


def _dataset(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    y = torch.sin(3 * x[:, :1]) + x[:, 1:] ** 2
    return x, y


_TRAIN_CALLS = 0


def _maybe_crash() -> None:
    """Crash-safety tests: SIGKILL this process at the N-th train() call (EVO_TOY_KILL_AT_TRAIN=N).
    Live-view tests: sleep EVO_TOY_TRAIN_SLEEP seconds per train() call, so a run lasts long enough
    to be watched on any machine."""
    global _TRAIN_CALLS
    _TRAIN_CALLS += 1
    if os.environ.get("EVO_TOY_KILL_AT_TRAIN") == str(_TRAIN_CALLS):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("EVO_TOY_TRAIN_SLEEP"):
        time.sleep(float(os.environ["EVO_TOY_TRAIN_SLEEP"]))


class ToyAgent(TorchAgent):
    kind = "tests.toy_agent:ToyAgent"

    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        return {
            "lr": HParam(3e-3, 1e-4, 3e-2, scale="log"),
            "batch_size": HParam(32, 8, 128, kind="int"),
            "weight_decay": HParam(0.0),
        }

    @classmethod
    def default_arch(cls) -> dict[str, Any]:
        return {"width": 16, "blocks": [16], "activation": "Tanh", "min_blocks": 0, "max_blocks": 3,
                "min_hidden": 8, "max_hidden": 64, "min_width": 8, "max_width": 64, "node_step": 8}

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        out = {"data_seed": 0, "n_train": 512, "n_val": 256, **task}
        for key in ("n_train", "n_val"):
            if not isinstance(out[key], int) or out[key] < 1:
                raise ValueError(f"task.{key}: expected a positive integer, found {out[key]!r}")
        unknown = sorted(set(out) - {"data_seed", "n_train", "n_val"})
        if unknown:
            raise ValueError(f"task.{unknown[0]}: unknown task key")
        return out

    @classmethod
    def create(cls, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
               context: AgentContext) -> ToyAgent:
        agent = cls.__new__(cls)
        agent.index, agent.context = index, context
        agent.arch, agent.hparams = dict(arch), dict(hparams)
        agent.init_rng(seed)
        agent._build(generator=agent.generator)
        return agent

    def _build(self, generator: torch.Generator | None = None) -> None:
        a = self.arch
        self.net = EvolvableMLP(2, 1, a["width"], a["blocks"], a["activation"], generator=generator)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.hparams["lr"],
                                    weight_decay=self.hparams["weight_decay"])
        task = self.context.task or self.validate_task({})
        self.x, self.y = _dataset(task["data_seed"], task["n_train"])
        self.xv, self.yv = _dataset(task["data_seed"] + 1, task["n_val"])
        self.steps_done = 0

    def networks(self) -> dict[str, torch.nn.Module]:
        return {"net": self.net}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]

    def train(self, steps: int) -> dict[str, float]:
        _maybe_crash()
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            idx = torch.randint(0, len(self.x), (int(self.hparams["batch_size"]),), generator=self.generator)
            loss = torch.nn.functional.mse_loss(self.net(self.x[idx]), self.y[idx])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        self.steps_done += steps
        return {"loss_mse": float(loss.detach())}

    def evaluate(self) -> Evaluation:
        with torch.no_grad():
            mse = float(torch.nn.functional.mse_loss(self.net(self.xv), self.yv))
        return Evaluation(-mse, {"val_mse": mse, "steps": float(self.steps_done)})

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        bounds = {k: v for k, v in self.arch.items() if k.startswith(("min_", "max_")) or k == "node_step"}
        change, record = self.net.mutate(rng, new_layer_prob, bounds, self.generator)
        remap_optimizer(self.opt, change)
        self.arch.update(self.net.arch())
        return record

    def set_activation(self, name: str) -> MutationRecord:
        remap_optimizer(self.opt, self.net.set_activation(name))
        self.arch["activation"] = name
        return MutationRecord(op="set_activation", function_preserving=False)

    def get_state(self) -> dict[str, Any]:
        return {"index": self.index, "arch": self.arch, "hparams": self.hparams, "steps_done": self.steps_done,
                "net": self.net.state_dict(), "opt": optimizer_state(self.opt, self.net), "rng": self.rng_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> ToyAgent:
        agent = cls.__new__(cls)
        agent.index, agent.context = int(state["index"]), context
        agent.arch, agent.hparams = dict(state["arch"]), dict(state["hparams"])
        agent._build()
        agent.net.load_state_dict(state["net"])
        load_optimizer_state(agent.opt, agent.net, state["opt"])
        agent.steps_done = int(state["steps_done"])
        agent.restore_rng(state["rng"])
        return agent


class CountingToyAgent(ToyAgent):
    """The toy agent reporting its cumulative `env_steps` (one per training step, carried by clones and
    checkpoints) as EfficientZero does, so the engine's compute accounting reads the agent's counter."""

    kind = "tests.toy_agent:CountingToyAgent"
    evaluations = 0  # evaluate() calls in this process (inline runs), for tests of what a run evaluates

    def train(self, steps: int) -> dict[str, float]:
        return {**super().train(steps), "env_steps": float(self.steps_done)}

    def evaluate(self) -> Evaluation:
        CountingToyAgent.evaluations += 1
        return super().evaluate()


class FadingToyAgent(CountingToyAgent):
    """The counting toy agent whose evaluations fade once it has trained past `PEAK_STEPS` steps (its
    fitness loses 0.1 per step beyond them), as an RL member that collapses after a peak: every line's
    best state lies behind it, which is what an async run's champion (selection.champion) is for."""

    kind = "tests.toy_agent:FadingToyAgent"
    PEAK_STEPS = 30

    def evaluate(self) -> Evaluation:
        ev = super().evaluate()
        return Evaluation(ev.fitness - 0.1 * max(0, self.steps_done - self.PEAK_STEPS), ev.metrics)


class DecodingToyAgent(ToyAgent):
    """The toy agent with an inference-only hyperparameter, `sharpness`, read only by `evaluate`: its
    fitness loses (log2(sharpness) − 3)², so 8 is best whatever the weights (evo.inference's tests)."""

    kind = "tests.toy_agent:DecodingToyAgent"
    inference_hparams = frozenset({"sharpness"})

    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        return {**super().default_hparams(), "sharpness": HParam(1.0, 0.125, 64.0, scale="log")}

    def evaluate(self) -> Evaluation:
        ev = super().evaluate()
        return Evaluation(ev.fitness - (np.log2(float(self.hparams["sharpness"])) - 3.0) ** 2, ev.metrics)
