"""GPU checks (marker `gpu`; skipped cleanly without CUDA, run with `./scripts/test.sh -m gpu`)."""

import pytest
import torch

from evo.evolvable import EvolvableMLP, remap_optimizer
from tests.optimizer_carry import OptimizerSnapshot

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
