import numpy as np
import pytest
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.envs import TINY_IMAGE_ID
from evo.agent import AgentContext
from evo.checkpoint import load_state, save_state
from evo.replay import build_replay

SMALL_ARCH = {"latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16, "proj_size": 16,
              "value_support": 10, "reward_support": 5}
# the conv variant at MinAtar's image size (4 x 10 x 10 there), small: for the float64 equality checks of
# its fast-path unroll (action maps, 1x1 convs as batched products), alone and fused
SMALL_CONV_ARCH = {"variant": "conv", "channels": 4, "num_res_blocks": 1, "reward_head_channels": 2, "head_channels": 2,
                   "width": 8, "lstm_hidden_size": 8, "fc_reward_layers": [8], "proj_size": 8, "value_support": 5,
                   "reward_support": 3, "downsample": False, "norm_type": "LN"}
FAST_HP = {"num_simulations": 4, "batch_size": 16, "replay_ratio": 0.25, "td_steps": 3, "num_unroll_steps": 3}
# segment_length 10: rows reach the store within a short call even when no episode ends in it
TASK = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 2, "min_replay": 16, "replay_capacity": 5000,
        "segment_length": 10}


def make(seed=0, index=0, arch=None, hp=None, task=None, replay=None):
    task = task or TASK
    if replay is None:
        replay = build_replay(EfficientZeroAgent.replay_spec(task), 0, distributed=False)
    ctx = AgentContext(task=task, replay=replay)
    return EfficientZeroAgent.create(arch or SMALL_ARCH, {**FAST_HP, **(hp or {})}, seed, index, ctx)


def params(agent):
    return torch.cat([p.detach().flatten() for p in agent.model.parameters()])


def test_train_reports_named_losses_and_pools_into_the_shared_store():
    store = build_replay(EfficientZeroAgent.replay_spec(TASK), 0, distributed=False)
    a, b = make(index=0, replay=store), make(seed=1, index=1, replay=store)
    metrics = a.train(60)
    for name in ("loss_value", "loss_policy", "loss_value_prefix", "loss_consistency"):
        assert np.isfinite(metrics[name]), name
    assert a.env_steps == 60 and a.updates > 0
    n = len(store)
    b.train(20)
    assert len(store) == n + 20  # both members write to the same store
    episodes = store.sample(64).data["episode"]
    assert {int(e) >> 40 for e in episodes} <= {0, 1}
    ev = a.evaluate()
    assert ev.fitness == ev.metrics["eval_return"] and ev.fitness > 0


def test_same_seed_same_member():
    a, b = make(seed=3), make(seed=3)
    assert torch.equal(params(a), params(b))
    ma, mb = a.train(80), b.train(80)
    assert torch.equal(params(a), params(b))
    assert ma["loss_value"] == mb["loss_value"]
    assert not torch.equal(params(make(seed=4)), params(a))


def test_checkpoint_round_trip_resumes_exactly(tmp_path):
    task = dict(TASK)
    a = make(task=task)
    a.train(40)
    a.mutate_architecture(np.random.default_rng(0), new_layer_prob=1.0)
    save_state(tmp_path / "ckpt", a.get_state())
    state, _ = load_state(tmp_path / "ckpt")
    # b gets a restored copy of the store so that both continue from identical replay contents
    from evo.replay import ReplayStore

    a.replay.snapshot(tmp_path / "replay")
    b = EfficientZeroAgent.from_state(state, AgentContext(task=task, replay=ReplayStore.restore(tmp_path / "replay")))
    assert b.arch == a.arch and b.hparams == a.hparams and b.env_steps == a.env_steps
    assert torch.equal(params(a), params(b))
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    for name in pa:
        sa, sb = a.optimizer.state.get(pa[name], {}), b.optimizer.state.get(pb[name], {})
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), (name, k)
    # evaluation is deterministic; training continues identically from the same rng state
    assert a.evaluate().fitness == b.evaluate().fitness
    # after a mutation the optimizer's parameter order differs from a fresh model's: both must train on
    ma, mb = a.train(40), b.train(40)
    assert ma["loss_total"] == mb["loss_total"] and torch.equal(params(a), params(b))


def test_clone_is_independent():
    a = make()
    a.train(30)
    c = a.clone(7)
    assert c.index == 7 and torch.equal(params(a), params(c))
    c.train(30)
    assert not torch.equal(params(a), params(c))


def test_set_hparams_reaches_the_optimizer():
    a = make()
    a.set_hparams({"lr": 1e-4, "num_simulations": 6})
    assert a.optimizer.param_groups[0]["lr"] == 1e-4 and a.hparams["num_simulations"] == 6
    with pytest.raises(ValueError, match="hparams.nope"):
        a.set_hparams({"nope": 1})


def _outputs(agent, obs):
    m = agent.model
    latent = m.represent(obs)
    hidden = m.initial_hidden(obs.shape[0])
    outs = list(m.predict(latent))
    for k in range(3):
        latent, hidden, vp = m.dynamics(latent, torch.tensor([k % 2] * obs.shape[0]), hidden)
        outs += [vp, *m.predict(latent)]
    return outs


def test_architecture_growth_is_function_preserving():
    a = make()
    for mod in a.model.modules():  # non-zero output layers, so preservation is a real check
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.normal_(mod.weight, std=0.3)
    obs = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    grown = 0
    for _ in range(12):
        before = _outputs(a, obs)
        record = a.mutate_architecture(rng, new_layer_prob=0.5)
        assert record.op != "none" or "reason" in record.details
        after = _outputs(a, obs)
        if record.function_preserving:
            grown += 1
            for x, y in zip(before, after):
                assert torch.allclose(x, y, atol=1e-6), record
    assert grown >= 3
    a.train(20)  # the optimizer follows the new parameters
    rebuilt = EfficientZeroAgent.from_state(a.get_state(), a.context)
    assert torch.equal(params(rebuilt), params(a))
    rebuilt.train(40)
    c = a.clone(3)
    c.set_activation("ELU")
    c.train(40)


def test_set_activation():
    a = make()
    record = a.set_activation("GELU")
    assert record.op == "set_activation" and a.arch["activation"] == "GELU"
    assert any(isinstance(m, torch.nn.GELU) for m in a.model.modules())
    assert not any(isinstance(m, torch.nn.ReLU) for m in a.model.modules())
    a.train(20)
    with pytest.raises(ValueError, match="activation"):
        a.set_activation("Nope")


def test_validation_errors_name_the_field():
    with pytest.raises(ValueError, match="task.num_envs"):
        EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "num_envs": 0})
    with pytest.raises(ValueError, match="task.env_id"):
        EfficientZeroAgent.validate_task({"env_id": "NoSuchEnv-v9"})
    with pytest.raises(ValueError, match="task.colour"):
        EfficientZeroAgent.validate_task({"colour": 1})
    with pytest.raises(ValueError, match="arch.latent_size"):
        EfficientZeroAgent.validate_arch({"latent_size": -1})
    with pytest.raises(ValueError, match="arch.bogus"):
        EfficientZeroAgent.validate_arch({"bogus": 1})
    with pytest.raises(ValueError, match="hparams.bogus"):
        make(hp={"bogus": 1})


def test_reanalyse_replaces_the_policy_targets_of_that_share_of_windows():
    """reanalyse_ratio 0.5 of 8 windows: exactly 4 get the target network's fresh search as their policy
    targets (at positions inside their trajectory); the other 4 keep the stored self-play policies."""
    from agents.efficientzero import learner

    a = make(hp={"reanalyse_ratio": 0.5})
    assert np.isfinite(a.train(60)["loss_policy"])  # trains with it
    hp = {**a.hparams, "batch_size": 8}
    seq = learner.sample_windows(a.replay, hp)
    boot = learner.bootstrap_values(a.target_model, learner.window_obs(seq))
    stored = learner.batch_from_windows(seq, boot, a.target_model, {**hp, "reanalyse_ratio": 0.0}, None)
    fresh = learner.batch_from_windows(seq, boot, a.target_model, hp, np.random.default_rng(0))
    old, new = stored.tensors["policy_target"], fresh.tensors["policy_target"]
    valid = stored.tensors["valid"].bool()
    changed = [(old[b][valid[b]] != new[b][valid[b]]).any().item() for b in range(8)]
    assert sum(changed) == 4, changed
    for b in range(8):
        assert torch.equal(old[b][~valid[b]], new[b][~valid[b]])  # past a trajectory's end: untouched
        assert changed[b] or torch.equal(old[b], new[b])


def test_conv_variant_on_tiny_image_env():
    task = {"env_id": TINY_IMAGE_ID, "num_envs": 2, "eval_episodes": 2, "min_replay": 16}
    a = make(task=task, arch={"channels": 4, "proj_size": 8, "lstm_hidden_size": 8, "value_support": 5,
                              "reward_support": 5})
    assert type(a.model).__name__ == "EfficientZeroConv"
    metrics = a.train(40)
    assert np.isfinite(metrics["loss_value"]) and a.updates > 0
    record = a.mutate_architecture(np.random.default_rng(1), 0.5)
    assert record.op in ("add_res_block", "remove_res_block", "none")
    ev = a.evaluate()
    assert -1.0 <= ev.fitness <= 1.0
    b = EfficientZeroAgent.from_state(a.get_state(), a.context)
    assert torch.equal(params(a), params(b))


def test_export_and_load(tmp_path):
    import agents

    a = make()
    a.train(30)
    out = a.export(tmp_path / "export", info={"run": "t", "generation": 1, "fitness": 1.0})
    b = agents.load(out)
    assert isinstance(b, EfficientZeroAgent) and torch.equal(params(a), params(b))
    assert b.evaluate().fitness == a.evaluate().fitness


def test_finer_support_bins_reach_targets_search_and_checkpoints(tmp_path):
    """A member with `support_step` 0.25 learns its value on bins a quarter as wide: the targets, the
    search's values and a restored member use the step; a bad step is refused by name."""
    from agents.efficientzero.support import scalar_to_support

    arch = {**SMALL_ARCH, "value_support": 40, "support_step": 0.25}
    a = make(arch=arch)
    assert a.model.support_step == 0.25 and a.arch["support_step"] == 0.25
    metrics = a.train(60)
    assert np.isfinite(metrics["loss_value"]) and a.updates > 0
    c = a.clone(1)
    assert c.model.support_step == 0.25 and torch.equal(params(a), params(c))
    save_state(tmp_path / "ckpt", a.get_state())
    state, _ = load_state(tmp_path / "ckpt")
    b = EfficientZeroAgent.from_state(state, AgentContext(task=TASK, replay=a.replay))
    assert b.model.support_step == 0.25 and b.evaluate().fitness == a.evaluate().fitness
    # the value the search reads for a root is the decoded expectation at this step (a step of 1 reads 4x it)
    from agents.efficientzero.mcts import _support_scalar

    logits = torch.log(scalar_to_support(torch.tensor([2.0], dtype=torch.float64), 40, step=0.25) + 1e-30)[0].numpy()
    assert abs(_support_scalar(logits, 40, 0.25) - 2.0) < 1e-6 and _support_scalar(logits, 40, 1.0) > 10
    # the learner's value targets sit on the fine bins: before any update the bootstrap values are 0 (the
    # value head starts at zero), so CartPole's 3-step targets lie in [1, 3] (read at the wrong step: 0.2-0.7)
    from agents.efficientzero import learner
    from agents.efficientzero.support import support_to_scalar

    fresh = make(arch=arch, task={**TASK, "min_replay": 10_000})
    fresh.train(60)
    assert fresh.updates == 0
    batch = learner.sample_batch(fresh.replay, fresh.target_model, fresh.hparams, np.random.default_rng(0))
    t = batch.tensors
    z = support_to_scalar(torch.log(t["value_target"] + 1e-30), 40, 0.25)[t["valid"] > 0]
    paid = z[z.abs() > 1e-3]  # (a row cut by its segment's end bootstraps from its own value, 0 here)
    assert len(paid) > len(z) / 2 and paid.min() > 0.99 and paid.max() < 3.01, z
    for bad in (0, -1.0, True, "fine", float("inf")):
        with pytest.raises(ValueError, match="arch.support_step: expected a positive number"):
            make(arch={**SMALL_ARCH, "support_step": bad})
