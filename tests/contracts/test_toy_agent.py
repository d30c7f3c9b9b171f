"""The agent contract over the engine's test agent (tests/toy_agent.py)."""

from __future__ import annotations

from typing import Any

import torch

from evo.testing import AgentContract
from tests.toy_agent import DecodingToyAgent, ToyAgent


class TestToyAgent(AgentContract):
    agent_class = ToyAgent
    task = {"n_train": 128, "n_val": 64}
    arch = {"width": 16, "blocks": [16]}
    hparams = {"batch_size": 16}
    train_steps = 5
    growth_atol = 0.0  # EvolvableMLP growth is exact: zero-initialised outgoing weights

    def probe(self, agent: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"prediction": agent.net(agent.xv)}


class TestDecodingToyAgent(TestToyAgent):
    """The toy agent with an inference-only hyperparameter (evo.inference's tests)."""

    agent_class = DecodingToyAgent
