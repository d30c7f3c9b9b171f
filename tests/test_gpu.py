"""GPU checks (marker `gpu`; skipped cleanly without CUDA, run with `./scripts/test.sh -m gpu`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import tomllib
import torch

from evo.agent import AgentContext
from evo.evolvable import EvolvableMLP, remap_optimizer
from tests.optimizer_carry import OptimizerSnapshot
from tests.toy_agent import ToyAgent

pytestmark = pytest.mark.gpu


def test_growth_and_adam_carry_over_on_cuda() -> None:
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    net = EvolvableMLP(6, 2, width=16, blocks=[16], activation="GELU", generator=g).to(device)
    x = torch.randn(64, 6, device=device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(x).pow(2).mean().backward()
    opt.step()
    before = net(x).detach()
    for grow in (lambda: net.widen_trunk(8), lambda: net.add_block(1, 12), lambda: net.widen_block(0, 4)):
        snapshot = OptimizerSnapshot.take([net], opt)
        remap_optimizer(opt, grow())
        counts = snapshot.assert_carried([net], opt)  # exp_avg, exp_avg_sq and step, on the overlap too
        assert counts["with_state"] > 0
    assert all(p.device.type == "cuda" for p in net.parameters())
    assert torch.allclose(net(x), before, atol=1e-5, rtol=0)
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()
    assert all(s["exp_avg"].device.type == "cuda" for s in opt.state.values())


# ---- a population on real CUDA through the Ray backend (docs/cluster.md) ------------------------
class CudaToyAgent(ToyAgent):
    """The toy agent on `context.device`: its network and data live there, and it reports where it
    trained. `from_state` notes the devices of the state it is given (in this process: the driver)."""

    kind = "tests.test_gpu:CudaToyAgent"
    states_seen_on: ClassVar[list[set[str]]] = []

    def _build(self, generator: torch.Generator | None = None) -> None:
        super()._build(generator)
        device = torch.device(self.context.device)
        self.net.to(device)  # in place: the optimizer keeps the same parameters
        self.x, self.y, self.xv, self.yv = (t.to(device) for t in (self.x, self.y, self.xv, self.yv))

    def train(self, steps: int) -> dict[str, float]:
        metrics = super().train(steps)
        p = next(self.net.parameters())
        return {**metrics, "on_cuda": float(p.is_cuda), "cuda_index": float(p.device.index or 0)}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> CudaToyAgent:
        cls.states_seen_on.append(tensor_devices(state))
        return super().from_state(state, context)


def tensor_devices(tree: Any) -> set[str]:
    """The device types of every tensor in a tree of dicts, lists and tuples."""
    if torch.is_tensor(tree):
        return {tree.device.type}
    if isinstance(tree, dict):
        return set().union(*map(tensor_devices, tree.values())) if tree else set()
    if isinstance(tree, (list, tuple)):
        return set().union(*map(tensor_devices, tree)) if tree else set()
    return set()


def test_a_population_trains_on_the_gpu_shares_ray_assigns(tmp_path: Path) -> None:
    """Two members per GPU (gpus_per_member = 0.5) on a local Ray: each actor trains on `cuda:0` of
    the devices Ray made visible to it, trained states come back to the driver as CPU tensors, and
    the driver writes the checkpoints."""
    import ray

    from evo.population import evolve, start_backend
    from evo.runstore import RunStore
    from evo.spec import parse_experiment
    from tests.conftest import TOY_EXPERIMENT

    if ray.is_initialized():
        ray.shutdown()
    data = tomllib.loads(TOY_EXPERIMENT.read_text())
    data.update(name="cuda", backend="ray")
    data["agent"] = {**data["agent"], "kind": CudaToyAgent.kind}
    data["population"] = {**data["population"], "generations": 2}
    data["resources"] = {"num_workers": 2, "cpus_per_member": 1, "gpus_per_member": 0.5, "timeout_s": 300}
    exp = parse_experiment(data, "<cuda>")
    store = RunStore.create(tmp_path, "cuda", TOY_EXPERIMENT.read_text(), exp.to_json())
    CudaToyAgent.states_seen_on.clear()
    scheduler, context = start_backend(exp, "ray")
    try:
        infos = scheduler.worker_info()
        for info in infos:
            assert info["device"] == "cuda:0" and info["cuda_devices"] == len(info["gpu_ids"]) == 1, info
            assert info["cuda_visible_devices"] == info["gpu_ids"][0], info  # Ray pinned the actor to its share
        evolve(exp, store, scheduler, context)
    finally:
        scheduler.close()
        ray.shutdown()
    assert store.failures() == []
    rows = store.evaluations(1)
    assert len(rows) == exp.population.size
    assert all(r["train_metrics"]["on_cuda"] == 1.0 and r["train_metrics"]["cuda_index"] == 0.0 for r in rows), rows
    # every state the driver rebuilt a member from (the workers' results) held CPU tensors only
    assert CudaToyAgent.states_seen_on and all(seen <= {"cpu"} for seen in CudaToyAgent.states_seen_on)
