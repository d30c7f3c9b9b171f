"""evo.training_thread: every path that trains members (a scheduler's worker, a member's round, an
agent's own train/evaluate, a fused group built by hand) runs with one torch thread, freed memory
kept and denormals flushed. Each case runs on a fresh thread with the FTZ/DAZ bits cleared first."""

from __future__ import annotations

import pytest
import torch

from evo.allocator import allocator_state
from evo.denormals import ENV
from evo.training_thread import prepare_training_thread
from tests.test_denormals import denormal_product, on_a_new_thread, pytestmark  # noqa: F401  (same platforms)


@pytest.fixture
def torch_threads():
    """Restores torch's intra-op thread count (process-wide) after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_thread_gets_one_torch_thread_kept_memory_and_flushed_denormals(torch_threads, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    threads, value = on_a_new_thread(lambda: (prepare_training_thread(1), torch.get_num_threads(), denormal_product())[1:])
    assert threads == 1 and value == 0.0
    assert allocator_state()["reason"] != "not asked"  # decided (applied, or opted out / not glibc, said why)
    assert on_a_new_thread(lambda: (prepare_training_thread(0), torch.get_num_threads())[1]) == 1  # at least one


def test_none_leaves_the_thread_count_and_still_flushes(torch_threads, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    threads, value = on_a_new_thread(lambda: (prepare_training_thread(None), torch.get_num_threads(), denormal_product())[1:])
    assert threads == 2 and value == 0.0
    monkeypatch.setenv(ENV, "keep")  # the opt-out still holds through the helper
    assert on_a_new_thread(lambda: (prepare_training_thread(None), denormal_product())[1]) > 0.0


def test_a_fused_group_built_by_hand_trains_on_one_thread_with_denormals_flushed(torch_threads, monkeypatch) -> None:
    from agents.efficientzero.agent import EfficientZeroAgent
    from agents.efficientzero.fused import FusedEfficientZero
    from evo.replay.protocol import build_replay
    from tests.efficientzero.test_fused import TASK, members

    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    group = members(build_replay(EfficientZeroAgent.replay_spec(TASK), 3, False))
    trainer = FusedEfficientZero()

    def train_then_probe() -> tuple[int, float]:
        trainer.train(group, 8)  # outside a scheduler: nothing else set up this thread
        return torch.get_num_threads(), denormal_product()

    assert on_a_new_thread(train_then_probe) == (1, 0.0)
