"""`task.autocast = "bf16"`: the learner's forward and backward run in bfloat16 where autocast says
(convolutions, matrix products), the networks, targets and Adam stay float32, and an update lands
close to the float32 one; bad settings are refused with the key named. "auto" is bf16 for conv
members on CPUs with bf16 kernels and off everywhere else."""

import copy
import warnings

import pytest
import torch

from agents.efficientzero import learner
from tests.efficientzero.test_agent import SMALL_CONV_ARCH, TASK, make

MLP_TASK = {**TASK, "eval_episodes": 1}  # test_agent's CartPole task, one evaluation episode
CONV_TASK = {**MLP_TASK, "env_id": "MinAtar/Breakout-v1"}
HP = {"num_unroll_steps": 3, "lstm_horizon_len": 3, "td_steps": 3}


@pytest.fixture(scope="module")
def member():
    agent = make(seed=0, hp=HP, task={**CONV_TASK, "autocast": "bf16"}, arch=SMALL_CONV_ARCH)
    agent.train(60)
    return agent


def _conv_output_dtypes(model, run):
    seen = set()
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_bf16_runs_the_update_convolutions_in_bfloat16_and_keeps_float32_weights(member):
    assert member.task["autocast"] == "bf16"
    assert _conv_output_dtypes(member.model, member.update) == {torch.bfloat16}
    assert {p.dtype for p in member.model.parameters()} == {torch.float32}
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in member.model.parameters())
    metrics = member.update()
    assert all(isinstance(v, float) and v == v for v in metrics.values())


def test_bf16_takes_the_loss_softmaxes_in_float32(member, monkeypatch):
    """CPU autocast leaves log_softmax in its input's dtype; the loss upcasts the bf16 logits first."""
    seen = []
    log_softmax = torch.nn.functional.log_softmax

    def spy(x, *args, **kwargs):
        seen.append(x.dtype)
        return log_softmax(x, *args, **kwargs)

    monkeypatch.setattr(learner.F, "log_softmax", spy)
    member.update()
    assert seen and set(seen) == {torch.float32}


def test_off_keeps_every_convolution_in_float32(member):
    member.task["autocast"] = "off"
    try:
        assert _conv_output_dtypes(member.model, member.update) == {torch.float32}
    finally:
        member.task["autocast"] = "bf16"


def test_bf16_gradients_point_where_float32_ones_do(member):
    """One update's gradients in bf16 against float32 on the same batches and weights: the same
    direction (cosine > 0.99; measured 0.999 on the Breakout file's member, 3-5% relative error),
    not the same bits (bf16 keeps 8 bits of mantissa)."""
    for _ in range(3):
        batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)
        grads, losses = {}, {}
        for mode in ("off", "bf16"):
            model = copy.deepcopy(member.model)
            opt = torch.optim.SGD(model.parameters(), lr=0.0)  # leaves the weights, keeps .grad
            losses[mode] = learner.update(model, copy.deepcopy(member.target_model), opt, member.replay, batch,
                                          member.hparams, 1, autocast=mode)["loss_total"]
            grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert grads["bf16"].dtype == torch.float32
        assert torch.nn.functional.cosine_similarity(grads["off"], grads["bf16"], dim=0) > 0.99
        assert (grads["bf16"] != grads["off"]).any()  # it did run in another precision
        assert losses["bf16"] == pytest.approx(losses["off"], rel=2e-2, abs=1e-2)


@pytest.mark.parametrize("task, match", [
    ({"autocast": "fp16"}, "task.autocast: expected one of"),
    ({"autocast": "bf16", "compile": "on"}, "needs compile = 'off'"),
    ({"autocast": "bf16", "dtype": "float64"}, "dtype = 'float32'"),
])
def test_bad_autocast_settings_are_refused(task, match):
    from agents.efficientzero.agent import EfficientZeroAgent

    with pytest.raises(ValueError, match=match):
        EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", **task})


def test_update_refuses_an_unknown_mode_and_compile_with_bf16(member):
    batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)
    for kwargs, match in (({"autocast": "fp16"}, "autocast: expected one of"),
                          ({"autocast": "bf16", "compile": True}, "cannot be combined with compile")):
        with pytest.raises(ValueError, match=match):
            learner.update(member.model, member.target_model, member.optimizer, member.replay, batch, member.hparams,
                           member.updates + 1, **kwargs)


def test_a_fused_group_says_it_does_not_autocast():
    from agents.efficientzero.fused import FusedEfficientZero
    from tests.efficientzero.test_agent import SMALL_ARCH

    task = {**MLP_TASK, "autocast": "bf16"}
    members = [make(seed=s, index=s, arch=SMALL_ARCH, task=task) for s in (0, 1)]
    trainer = FusedEfficientZero()
    with pytest.warns(UserWarning, match="task.autocast applies to members trained one by one"):
        trainer._group(members)


def test_bf16_on_a_cpu_without_bf16_instructions_warns_once(member, monkeypatch):
    """Without AVX-512 BF16 or AMX, oneDNN emulates bf16: the conv member's updates get slower, not faster."""
    batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)

    def update():
        member.updates += 1
        learner.update(member.model, member.target_model, member.optimizer, member.replay, batch, member.hparams,
                       member.updates, autocast="bf16")

    monkeypatch.setattr(learner, "_bf16_kernels_checked", False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not learner.cpu_has_bf16_kernels()
    with pytest.warns(UserWarning, match="without bf16 instructions"):
        update()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        update()  # once per process
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert learner.cpu_has_bf16_kernels()  # AMX alone is enough


@pytest.mark.parametrize("has_kernels, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_is_bf16_for_a_conv_member_only_on_a_cpu_with_bf16_kernels(member, monkeypatch, has_kernels, expected):
    monkeypatch.setattr(learner, "_auto_cpu_has_bf16", has_kernels)
    monkeypatch.setitem(member.task, "autocast", "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" never picks emulated bf16, so never warns about it
        assert _conv_output_dtypes(member.model, member.update) == {expected}
    assert learner.effective_autocast("auto", member.model) == ("bf16" if has_kernels else "off")
    assert learner.effective_autocast("auto", member.model, compile=True) == "off"


def test_auto_asks_the_cpu_once_per_process(member, monkeypatch):
    asked = []
    monkeypatch.setattr(learner, "_auto_cpu_has_bf16", None)
    monkeypatch.setattr(learner, "cpu_has_bf16_kernels", lambda: asked.append(1) or True)
    for _ in range(3):
        assert learner.effective_autocast("auto", member.model) == "bf16"
    assert asked == [1]


def test_auto_is_off_for_an_mlp_member_and_a_float64_one(monkeypatch):
    from tests.efficientzero.test_agent import SMALL_ARCH

    monkeypatch.setattr(learner, "_auto_cpu_has_bf16", True)
    task = {**MLP_TASK, "autocast": "auto"}
    mlp = make(seed=0, arch=SMALL_ARCH, task=task)
    assert learner.effective_autocast("auto", mlp.model) == "off"
    conv64 = make(seed=0, arch=SMALL_CONV_ARCH, task={**CONV_TASK, "autocast": "auto", "dtype": "float64"})
    assert learner.effective_autocast("auto", conv64.model) == "off"
    assert learner.effective_autocast("bf16", mlp.model) == "bf16"  # an explicit mode is taken as written


def test_auto_is_accepted_beside_compile_and_float64():
    """Unlike "bf16", "auto" never conflicts: it is off wherever bf16 could not run."""
    from agents.efficientzero.agent import EfficientZeroAgent

    for extra in ({"compile": "on"}, {"dtype": "float64"}):
        task = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "autocast": "auto", **extra})
        assert task["autocast"] == "auto"


def test_a_fused_group_of_mlp_members_with_auto_does_not_warn(monkeypatch):
    from agents.efficientzero.fused import FusedEfficientZero
    from tests.efficientzero.test_agent import SMALL_ARCH

    monkeypatch.setattr(learner, "_auto_cpu_has_bf16", True)
    task = {**MLP_TASK, "autocast": "auto"}
    members = [make(seed=s, index=s, arch=SMALL_ARCH, task=task) for s in (0, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FusedEfficientZero()._group(members)
