"""The agent contract over a tiny ILQL (randomwalks, a 2-layer 32-wide GPT-2)."""

from __future__ import annotations

from typing import Any

import torch

from agents.ilql import ILQLAgent
from evo.testing import AgentContract

# fixed token sequences for the function-preservation probe (the randomwalks vocabulary has 22 tokens)
_TOKENS = torch.tensor([[1, 4, 9, 3, 12, 7, 2, 5], [0, 21, 6, 6, 11, 8, 14, 10]])
_STATES = torch.arange(8).expand(2, 8)
_ACTIONS = torch.arange(7).expand(2, 7)


class TestILQL(AgentContract):
    agent_class = ILQLAgent
    task = {"task": "randomwalks", "eval_samples": 2}
    arch = {"n_layer": 2, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64}
    hparams = {"batch_size": 16}
    train_steps = 2

    def probe(self, agent: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            out = agent.ilql.model(_TOKENS, _STATES, _ACTIONS)
        return {"logits": out["logits"], "q1": out["qs"][0], "q2": out["qs"][-1], "v": out["vs"],
                "target_q1": out["target_qs"][0]}

    def arch_bound_violations(self, agent: Any) -> list[str]:
        out = super().arch_bound_violations(agent)
        arch = agent.arch
        if not arch["min_layers"] <= arch["n_layer"] <= arch["max_layers"]:
            out.append(f"arch.n_layer = {arch['n_layer']}: outside [{arch['min_layers']}, {arch['max_layers']}]")
        return out
