"""`task.compile = "on"`: the learner's loss and backward through torch.compile.

The default run only checks the option and the eager fallbacks (no compile: a test must not pay one);
the compiled graph itself is checked by the slow tests (a cold compile is ~30-60 s on a 2-core CPU,
a warm load from inductor's disk cache a few seconds)."""

import copy

import pytest
import torch

from agents.efficientzero import learner
from tests.efficientzero.test_agent import make

TASK64 = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 2, "min_replay": 16, "replay_capacity": 5000,
          "segment_length": 10, "dtype": "float64"}


@pytest.fixture()
def fresh_compile_state(monkeypatch):
    """This process's compiled-graph bookkeeping, emptied for the test and restored after it."""
    for key, value in (("fn", None), ("graphs", {}), ("failed", set())):
        monkeypatch.setitem(learner._compiled, key, value)


def _random_outputs(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, dtype=mod.weight.dtype) * 0.3)


def _failing_compiler(monkeypatch, message):
    """torch.compile replaced by one whose compiled function raises `message` (as a missing C++
    compiler would); returns the list that records each call of a compiled function."""
    calls = []

    def broken_compile(fn, **kwargs):
        def run(*args, **kw):
            calls.append(1)
            raise RuntimeError(message)
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    return calls


def _two_updates(agent, batch, compile):
    model, target = copy.deepcopy(agent.model), copy.deepcopy(agent.target_model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    metrics = [learner.update(model, target, opt, agent.replay, batch, agent.hparams, step, compile=compile)
               for step in (1, 2)]
    return metrics, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_task_compile_is_checked():
    from agents.efficientzero.agent import EfficientZeroAgent

    assert EfficientZeroAgent.validate_task({"env_id": "CartPole-v1"})["compile"] == "off"
    assert EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "compile": "on"})["compile"] == "on"
    with pytest.raises(ValueError, match="task.compile"):
        EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "compile": True})


def test_compile_cache_dir_is_shared_and_overridable(monkeypatch, tmp_path):
    monkeypatch.setattr(learner, "_USER_CACHE_DIR", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torch-wrote-its-default-here")
    assert learner.compile_cache_dir() == str(tmp_path / "evo" / "torchinductor")
    monkeypatch.setattr(learner, "_USER_CACHE_DIR", "/somewhere/else")  # set before the process started
    assert learner.compile_cache_dir() == "/somewhere/else"


def test_over_the_graph_cap_a_member_trains_eagerly(fresh_compile_state, monkeypatch):
    """No architecture may compile (cap 0): `update(compile=True)` is the eager update, bit for bit."""
    monkeypatch.setattr(learner, "MAX_COMPILED_GRAPHS", 0)
    agent = make(seed=0)
    agent.train(60)
    batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
    want = _two_updates(agent, batch, compile=False)
    got = _two_updates(agent, batch, compile=True)
    assert got[0] == want[0] and torch.equal(got[1], want[1])
    assert learner._compiled["fn"] is None and learner.compile_stats()["compiled_graphs"] == 0


def test_a_failed_compile_falls_back_to_eager_once(fresh_compile_state, monkeypatch):
    """A compiler that fails (here torch.compile's result raising, as a missing C++ compiler would):
    one warning, the architecture is remembered as eager, and the update equals the eager one."""
    calls = _failing_compiler(monkeypatch, "no C++ compiler")
    agent = make(seed=0)
    agent.train(60)
    batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
    want = _two_updates(agent, batch, compile=False)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        got = _two_updates(agent, batch, compile=True)
    assert got[0] == want[0] and torch.equal(got[1], want[1])
    assert len(calls) == 1  # the second update did not try again
    assert learner.compile_stats()["compile_failures"] == 1


@pytest.mark.slow
def test_compiled_float64_losses_gradients_and_updates_equal_eager(fresh_compile_state):
    """One graph (float64, ~30-60 s cold): losses and gradients equal the eager fast path's to 1e-10;
    a second batch size and a second member of the same architecture reuse it; a mutated architecture
    over the cap trains eagerly."""
    agent = make(seed=0, hp={"num_unroll_steps": 5, "lstm_horizon_len": 2, "td_steps": 3}, task=TASK64)
    agent.train(80)
    _random_outputs(agent.model, 1)
    _random_outputs(agent.target_model, 2)
    batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
    hp = agent.hparams
    model = agent.model
    model.train()
    results = {}
    for mode in ("eager", "compiled"):
        if mode == "eager":
            weights = {n: float(hp[n]) for n in learner.LOSS_WEIGHTS.values()}
            terms = learner.loss_terms(model, dict(model.named_parameters()), dict(model.named_buffers()),
                                       batch.tensors, {**weights, "lstm_horizon_len": 2})
        else:
            terms = learner.compiled_loss(model, batch.tensors, hp)
            assert terms is not None
        model.zero_grad(set_to_none=True)
        terms["loss_total"].backward()
        results[mode] = (terms, {n: p.grad.clone() for n, p in model.named_parameters()})
    (want, want_g), (got, got_g) = results["eager"], results["compiled"]
    for name in want:
        assert torch.allclose(got[name].detach(), want[name].detach(), rtol=1e-10, atol=1e-10), name
    for name, g in want_g.items():
        assert g.abs().max() > 0, name
        assert torch.allclose(got_g[name], g, rtol=1e-10, atol=1e-10), name
    assert learner.compile_stats()["compiled_graphs"] == 1

    # whole updates (Adam, clipping, priorities) on both sides
    want_u, got_u = _two_updates(agent, batch, False), _two_updates(agent, batch, True)
    assert torch.allclose(got_u[1], want_u[1], rtol=1e-10, atol=1e-10)

    # another batch size, another member of the architecture: the same graph
    other = make(seed=5, hp={"num_unroll_steps": 5, "lstm_horizon_len": 2, "td_steps": 3, "batch_size": 24},
                 task=TASK64, replay=agent.replay)
    small = learner.sample_batch(other.replay, other.target_model, other.hparams, other.rng)
    assert small.tensors["obs"].shape[0] == 24
    assert learner.compiled_loss(other.model, small.tensors, other.hparams) is not None
    assert learner.compile_stats()["compiled_graphs"] == 1

    # a new architecture beyond the cap: eager (None), no compile
    import numpy as np

    learner.MAX_COMPILED_GRAPHS, cap = 1, learner.MAX_COMPILED_GRAPHS
    try:
        other.model.mutate_architecture(np.random.default_rng(0), 1.0, other.arch)
        assert learner.compiled_loss(other.model, small.tensors, other.hparams) is None
    finally:
        learner.MAX_COMPILED_GRAPHS = cap


def test_while_another_process_compiles_the_graph_the_member_trains_eagerly(fresh_compile_state, monkeypatch, tmp_path):
    """The graph's lock is held (as by another process compiling it; flock conflicts between two open
    files in one process too): updates run eagerly without compiling; once it is released the next
    update compiles (here: a compiler that fails, so the fallback shows that it was tried)."""
    pytest.importorskip("fcntl")  # POSIX: elsewhere there is no lock

    calls = _failing_compiler(monkeypatch, "compiler tried")
    monkeypatch.setattr(learner, "_USER_CACHE_DIR", str(tmp_path))
    agent = make(seed=0)
    agent.train(60)
    batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
    key = learner._graph_key(agent.model, int(agent.hparams["lstm_horizon_len"]))
    held = learner._compile_lock(key)
    assert held and learner._compile_lock(key) is False
    want = _two_updates(agent, batch, compile=False)
    got = _two_updates(agent, batch, compile=True)  # eager while the lock is held
    assert got[0] == want[0] and torch.equal(got[1], want[1])
    assert calls == []
    held.close()
    with pytest.warns(RuntimeWarning, match="compiler tried"):
        _two_updates(agent, batch, compile=True)
    assert len(calls) == 1


@pytest.mark.slow
def test_compiled_float32_updates_agree_with_eager_to_rounding(fresh_compile_state):
    """In float32 the compiled kernels round differently, and no more: 20 updates on the same batches
    from the same state leave the weights within 1e-5 of the eager fast path's (they move by ~1e-1)."""
    agent = make(seed=3, hp={"num_unroll_steps": 5, "lstm_horizon_len": 5, "td_steps": 3})
    agent.train(80)
    batches = [learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng) for _ in range(20)]
    start = torch.cat([p.detach().flatten() for p in agent.model.parameters()])
    weights = {}
    for compile in (False, True):
        model, target = copy.deepcopy(agent.model), copy.deepcopy(agent.target_model)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
        for step, batch in enumerate(batches, 1):
            learner.update(model, target, opt, agent.replay, batch, agent.hparams, step, compile=compile)
        weights[compile] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert learner.compile_stats()["compiled_graphs"] == 1
    assert (weights[False] - start).abs().max() > 1e-2
    assert (weights[True] - weights[False]).abs().max() < 1e-5
