"""The agent contract over a tiny EfficientZero (CartPole, 2 envs, 4 simulations, 16-wide networks)."""

from __future__ import annotations

from typing import Any

import torch

from agents.efficientzero import EfficientZeroAgent
from evo.testing import AgentContract

# a fixed batch of CartPole-shaped observations and actions for the function-preservation probe
_OBS = torch.linspace(-0.5, 0.5, 4 * 4).reshape(4, 4)
_ACTIONS = torch.tensor([0, 1, 1, 0])


class TestEfficientZero(AgentContract):
    agent_class = EfficientZeroAgent
    task = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 2, "min_replay": 8, "replay_capacity": 2000}
    arch = {"latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16, "proj_size": 16,
            "value_support": 10, "reward_support": 5,
            # tight bounds: the mutation checks reach them within a few draws, and the networks stay small
            "max_blocks": 2, "max_hidden": 48, "max_width": 48, "max_lstm_hidden_size": 48}
    hparams = {"num_simulations": 4, "batch_size": 32, "td_steps": 3, "num_unroll_steps": 3}
    train_steps = 16  # env steps: 8 per env; learning starts once the store holds min_replay rows

    def probe(self, agent: Any) -> dict[str, torch.Tensor]:
        model = agent.model
        with torch.no_grad():
            latent = model.represent(_OBS)
            policy, value = model.predict(latent)
            # the LSTM's own state is left out: widening it changes its size, not what the model predicts
            next_latent, _, value_prefix = model.dynamics(latent, _ACTIONS, model.initial_hidden(len(_OBS)))
            return {"latent": latent, "policy": policy, "value": value, "next_latent": next_latent,
                    "value_prefix": value_prefix, "projection": model.project(latent)}
