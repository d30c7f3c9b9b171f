"""The example agent of docs/agents.md passes the agent contract, and the page shows it verbatim."""

from __future__ import annotations

from pathlib import Path

import torch

from evo.testing import AgentContract
from tests.contracts.example_agent import Reinforce

REPO = Path(__file__).resolve().parents[2]
_OBS = torch.linspace(-0.2, 0.2, 8).reshape(2, 4)  # two CartPole-shaped observations


class TestReinforce(AgentContract):
    agent_class = Reinforce
    task = {"env_id": "CartPole-v1", "eval_episodes": 2}
    train_steps = 2  # episodes

    def probe(self, agent: Reinforce) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"logits": agent.policy(_OBS)}


def test_docs_show_the_example_agent_as_tested() -> None:
    page = (REPO / "docs" / "agents.md").read_text()
    source = (REPO / "tests" / "contracts" / "example_agent.py").read_text()
    assert source in page, "docs/agents.md must include tests/contracts/example_agent.py verbatim (copy it in again)"
