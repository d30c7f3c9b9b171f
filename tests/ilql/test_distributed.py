"""ILQL members drawing from the Ray replay service give the same batches as from the in-process store."""

from __future__ import annotations

from agents.ilql.agent import ILQLAgent
from evo.agent import AgentContext
from evo.replay import build_replay

ARCH = {"n_layer": 1, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64}


def test_service_and_local_store_give_identical_training(ray_cluster):
    task = ILQLAgent.validate_task({"task": "randomwalks", "eval_samples": 1})
    service = build_replay(ILQLAgent.replay_spec(task), 0, distributed=True)
    local = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    assert len(service) == len(local) == 1000
    arch = ILQLAgent.validate_arch(ARCH)
    a = ILQLAgent.create(arch, {}, seed=3, index=0, context=AgentContext(task=task, replay=service))
    b = ILQLAgent.create(arch, {}, seed=3, index=0, context=AgentContext(task=task, replay=local))
    assert a.train(3) == b.train(3)
    service.stop()
