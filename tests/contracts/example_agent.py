"""REINFORCE on a gymnasium environment: the minimal evo agent of docs/agents.md."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from evo.agent import AgentContext, Evaluation, TorchAgent
from evo.evolvable import EvolvableMLP, load_optimizer_state, optimizer_state, remap_optimizer
from evo.hparams import HParam
from evo.records import MutationRecord


class Reinforce(TorchAgent):
    """A softmax policy (an evolvable residual MLP) trained by REINFORCE, one episode per step."""

    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        return {"lr": HParam(1e-2, min=1e-4, max=1e-1, scale="log"),
                "gamma": HParam(0.99, min=0.9, max=0.999)}

    @classmethod
    def default_arch(cls) -> dict[str, Any]:
        return {"width": 32, "blocks": [32], "activation": "Tanh", "min_blocks": 0, "max_blocks": 3,
                "min_hidden": 8, "max_hidden": 128, "min_width": 8, "max_width": 128, "node_step": 8}

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        out = {"env_id": "CartPole-v1", "eval_episodes": 3, **task}
        unknown = sorted(set(out) - {"env_id", "eval_episodes"})
        if unknown:
            raise ValueError(f"task.{unknown[0]}: unknown key; expected env_id or eval_episodes")
        return out

    # ---- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
               context: AgentContext) -> Reinforce:
        agent = cls.__new__(cls)
        agent.index, agent.context = index, context
        agent.arch, agent.hparams = dict(arch), dict(hparams)
        agent.init_rng(seed)  # self.generator (torch) and self.rng (numpy): the member's only randomness
        agent._build(agent.generator)
        return agent

    def _build(self, generator: torch.Generator | None = None) -> None:
        task = self.validate_task(self.context.task)
        self.env = gym.make(task["env_id"])
        a = self.arch
        self.policy = EvolvableMLP(self.env.observation_space.shape[0], int(self.env.action_space.n),
                                   a["width"], a["blocks"], a["activation"], generator=generator)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.hparams["lr"])
        self.episodes = 0

    def networks(self) -> dict[str, torch.nn.Module]:
        return {"policy": self.policy}  # perturbed by parameter mutation

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]  # receive lr changes from set_hparams

    # ---- train / evaluate -----------------------------------------------------------------------
    def _episode(self, seed: int, greedy: bool) -> tuple[list[torch.Tensor], list[float]]:
        obs, _ = self.env.reset(seed=seed)
        log_probs, rewards, done = [], [], False
        while not done:
            logits = self.policy(torch.as_tensor(obs, dtype=torch.float32))
            if greedy:
                action = int(logits.argmax())
            else:
                action = int(torch.multinomial(logits.softmax(-1), 1, generator=self.generator))
                log_probs.append(logits.log_softmax(-1)[action])
            obs, reward, terminated, truncated, _ = self.env.step(action)
            rewards.append(float(reward))
            done = terminated or truncated
        return log_probs, rewards

    def train(self, steps: int) -> dict[str, float]:
        """`steps` episodes, one policy-gradient update each."""
        metrics: dict[str, float] = {}
        for _ in range(steps):
            log_probs, rewards = self._episode(seed=int(self.rng.integers(2**31)), greedy=False)
            returns, g = [], 0.0
            for r in reversed(rewards):
                g = r + self.hparams["gamma"] * g
                returns.append(g)
            target = torch.tensor(returns[::-1])
            target = (target - target.mean()) / (target.std(correction=0) + 1e-8)
            loss = -(torch.stack(log_probs) * target).sum()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.episodes += 1
            metrics = {"loss": loss.item(), "episode_return": float(sum(rewards))}
        return metrics

    def evaluate(self) -> Evaluation:
        """Greedy episodes on seeds fixed by the run seed: every member is scored on the same starts."""
        task = self.validate_task(self.context.task)
        with torch.no_grad():
            returns = [sum(self._episode(self.context.seed * 1000 + i, greedy=True)[1])
                       for i in range(task["eval_episodes"])]
        return Evaluation(float(np.mean(returns)), {"eval_return_std": float(np.std(returns))})

    # ---- mutation (set_hparams and perturb_parameters come from TorchAgent) ------------------------
    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        bounds = {k: v for k, v in self.arch.items() if k.startswith(("min_", "max_")) or k == "node_step"}
        change, record = self.policy.mutate(rng, new_layer_prob, bounds, self.generator)
        remap_optimizer(self.optimizer, change)  # Adam's moments follow the resized weights
        self.arch.update(self.policy.arch())
        return record

    # ---- state (checkpoints, clones, Ray transport, export) ----------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {"index": self.index, "arch": self.arch, "hparams": self.hparams, "episodes": self.episodes,
                "policy": self.policy.state_dict(), "optimizer": optimizer_state(self.optimizer, self.policy),
                "rng": self.rng_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> Reinforce:
        agent = cls.__new__(cls)
        agent.index, agent.context = int(state["index"]), context
        agent.arch, agent.hparams = dict(state["arch"]), dict(state["hparams"])
        agent._build()
        agent.policy.load_state_dict(state["policy"])
        load_optimizer_state(agent.optimizer, agent.policy, state["optimizer"])
        agent.episodes = int(state["episodes"])
        agent.restore_rng(state["rng"])
        return agent
