"""evo.denormals: where members train, denormal floats are flushed to zero on the training thread;
`EVO_DENORMALS=keep` keeps them. The bits are per thread, so every case runs on a fresh thread with
them cleared first, and pytest's own thread is left as it was."""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from evo.agent import AgentContext
from evo.denormals import ENV, denormals_state, flush_denormals
from evo.scheduler.base import train_and_evaluate
from tests.toy_agent import ToyAgent

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
                                reason="torch flushes denormals on x86 (SSE3) and AArch64 only")


def denormal_product() -> float:
    """1e-30 * 1e-10 in float32: 1e-40, a denormal, unless the thread flushes it to 0."""
    return float(torch.tensor([1e-30]) * torch.tensor([1e-10]))


def on_a_new_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` on a new thread whose FTZ/DAZ bits are cleared first; its result or its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        torch.set_flush_denormal(False)
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_without_the_call_a_denormal_product_stays_denormal() -> None:
    value = on_a_new_thread(denormal_product)
    assert 0.0 < value < torch.finfo(torch.float32).tiny  # the probe can fail: the CPU keeps denormals by default


def test_flushed_denormals_become_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    flushed, value = on_a_new_thread(lambda: (flush_denormals(), denormal_product()))
    assert flushed is True and value == 0.0
    assert denormals_state() == {"flushed": True, "reason": "FTZ+DAZ"}
    assert on_a_new_thread(lambda: (flush_denormals(), denormal_product(), flush_denormals())[1:]) == (0.0, True)


def test_evo_denormals_keep_clears_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "keep")

    def flushed_then_kept() -> tuple[bool, float]:
        torch.set_flush_denormal(True)
        return flush_denormals(), denormal_product()

    flushed, value = on_a_new_thread(flushed_then_kept)
    assert flushed is False and value > 0.0
    assert denormals_state() == {"flushed": False, "reason": f"{ENV}=keep"}


class _ProbingToyAgent(ToyAgent):
    """Reports, as a train metric, what its training thread makes of a denormal product."""

    def train(self, steps: int) -> dict[str, float]:
        return {**super().train(steps), "denormal_product": denormal_product()}


def test_train_and_evaluate_flushes_on_the_thread_that_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    agent = _ProbingToyAgent.create(ToyAgent.default_arch(), {n: h.value for n, h in ToyAgent.default_hparams().items()},
                                    seed=0, index=0, context=AgentContext(task=None))
    metrics, evaluation, _ = on_a_new_thread(lambda: train_and_evaluate(agent, 2))
    assert metrics["denormal_product"] == 0.0 and evaluation is not None
    monkeypatch.setenv(ENV, "keep")
    metrics, _, _ = on_a_new_thread(lambda: train_and_evaluate(agent, 2))
    assert metrics["denormal_product"] > 0.0


def test_an_efficientzero_member_trains_with_denormals_flushed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.efficientzero.test_agent import make

    monkeypatch.delenv(ENV, raising=False)
    agent = make(seed=0)

    def train_then_probe() -> float:
        agent.train(8)  # built by hand, outside a scheduler
        return denormal_product()

    assert on_a_new_thread(train_then_probe) == 0.0


def test_the_speed_benchmark_keeps_denormals_only_on_its_baseline_and_denormals_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from benchmarks.efficientzero_speed import arm

    monkeypatch.delenv(ENV, raising=False)
    agent = SimpleNamespace(task={"compile": "off", "autocast": "off"})

    def inside(name: str) -> tuple[str | None, float]:
        with arm(agent, name):
            return os.environ.get(ENV), denormal_product()

    for name, kept in (("baseline", True), ("fast", False), ("denormals", True), ("bf16", False)):
        env, value = on_a_new_thread(lambda name=name: inside(name))
        assert (env == "keep") is kept and (value > 0.0) is kept, name
    assert ENV not in os.environ and agent.task == {"compile": "off", "autocast": "off"}
