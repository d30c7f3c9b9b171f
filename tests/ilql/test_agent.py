"""ILQLAgent through the engine's Agent protocol: replay store, clone, state, mutation, export."""

import json

import numpy as np
import pytest
import torch

from agents.ilql.agent import ILQLAgent
from evo.agent import AgentContext
from evo.checkpoint import load_state, save_state
from evo.replay import build_replay

ARCH = {"n_layer": 2, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64}


@pytest.fixture(scope="module")
def context():
    task = ILQLAgent.validate_task({"task": "randomwalks", "eval_samples": 2})
    store = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    return AgentContext(task=task, replay=store, seed=0)


def _agent(context, seed=1, index=0, **hp):
    return ILQLAgent.create(ILQLAgent.validate_arch(ARCH), hp, seed=seed, index=index, context=context)


def test_replay_holds_the_whole_multiset_of_walks(context):
    assert len(context.replay) == 1000  # duplicate walks stay distinct rows


def test_validation_errors_name_the_field():
    with pytest.raises(ValueError, match=r"task.task: expected one of \['randomwalks', 'wordle', 'jsonl'\], found 'chess'"):
        ILQLAgent.validate_task({"task": "chess"})
    with pytest.raises(ValueError, match="task.n_walks: expected a non-negative int, found 'many'"):
        ILQLAgent.validate_task({"task": "randomwalks", "n_walks": "many"})
    with pytest.raises(ValueError, match="task.colour: unknown key"):
        ILQLAgent.validate_task({"task": "randomwalks", "colour": 1})
    with pytest.raises(ValueError, match="arch.max_layers|arch.n_layer"):
        ILQLAgent.validate_arch({"n_layer": 9})


def test_members_are_reproducible_from_their_seed(context):
    a, b = _agent(context, seed=5), _agent(context, seed=5)
    assert a.train(3) == b.train(3)
    assert a.evaluate() == b.evaluate()
    c = _agent(context, seed=6)
    assert c.train(3) != _agent(context, seed=5).train(3)


def test_state_round_trip_through_safetensors(tmp_path, context):
    a = _agent(context, seed=2)
    a.train(2)
    a.mutate_architecture(np.random.default_rng(0), new_layer_prob=1.0)
    save_state(tmp_path / "s", a.get_state())
    state, _ = load_state(tmp_path / "s")
    b = ILQLAgent.from_state(state, context)
    assert b.arch == a.arch and b.hparams == a.hparams and json.loads(b.tokenizer_json) == json.loads(a.tokenizer_json)
    for (n1, p1), (n2, p2) in zip(a.ilql.model.state_dict().items(), b.ilql.model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert a.train(2) == b.train(2)


def test_clone_carries_optimizer_and_set_hparams_reaches_the_learner(context):
    a = _agent(context, seed=3)
    a.train(1)
    b = a.clone(4)
    assert b.index == 4 and len(b.ilql.optimizer.state) == len(a.ilql.optimizer.state) > 0
    b.set_hparams({"lr": 1e-4, "tau": 0.9, "cql_weight": 0.5, "alpha": 0.2, "batch_size": 16})
    assert b.ilql.optimizer.param_groups[0]["lr"] == 1e-4 and b.ilql.loss_cfg.tau == 0.9
    assert b.ilql.loss_cfg.cql_weight == 0.5 and b.ilql.alpha == 0.2 and b.ilql.batch_size == 16
    assert a.ilql.loss_cfg.tau == 0.7


def test_architecture_mutations_stay_in_bounds(context):
    a = _agent(context, seed=4)
    rng = np.random.default_rng(0)
    for _ in range(8):
        record = a.mutate_architecture(rng, new_layer_prob=0.5)
        assert record.op in ("add_layer", "remove_layer", "widen_ff")
        assert a.arch["min_layers"] <= a.ilql.model.n_layer <= a.arch["max_layers"]
        json.dumps(record.to_json())
    a.set_activation("Tanh")
    a.perturb_parameters(rng, 0.01)
    assert np.isfinite(a.train(2)["loss"])


def test_hf_export_loads_offline_and_generates(tmp_path, context):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = _agent(context, seed=8)
    a.train(2)
    a.export(tmp_path / "out")
    assert (tmp_path / "out" / "agent").is_dir() and (tmp_path / "out" / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "hf", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "out" / "hf", local_files_only=True)
    ids = tok("b", return_tensors="pt").input_ids
    assert ids.tolist() == [[2]]
    with torch.no_grad():
        ours = a.ilql.model.gpt(input_ids=ids).logits
        theirs = model(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    text = tok.decode(out[0], skip_special_tokens=True)
    assert out.shape == (1, 5) and text[0] == "b" and len(text) == 5

    import agents

    again = agents.load(tmp_path / "out")
    assert isinstance(again, ILQLAgent) and again.arch == a.arch


def test_export_refuses_activations_hugging_face_cannot_express(tmp_path, context):
    a = _agent(context, seed=9)
    a.set_activation("ELU")
    with pytest.raises(ValueError, match="export: activation 'ELU' has no Hugging Face equivalent"):
        a.export(tmp_path / "out")


def test_wordle_member_trains_and_reports_return_and_bc():
    task = ILQLAgent.validate_task({"task": "wordle", "n_games": 60, "n_words": 16, "eval_samples": 1})
    store = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    assert len(store) == 60
    ctx = AgentContext(task=task, replay=store, seed=0)
    agent = ILQLAgent.create(ILQLAgent.validate_arch({**ARCH, "n_layer": 1}), {"batch_size": 8}, seed=0, index=0,
                             context=ctx)
    assert agent.arch["block_size"] >= 61
    losses = agent.train(2)
    assert {"loss_q", "loss_v", "loss_cql", "loss_awac", "loss_dm"} <= set(losses)
    ev = agent.evaluate()
    wins = ev.metrics["win_rate"]
    # a win costs 1..6 guesses, a loss scores -6: the mean return is bounded by the win rate
    assert ev.fitness == ev.metrics["mean_return"] and -6.0 <= ev.fitness <= -1.0 * wins - 6.0 * (1 - wins)
    assert {"bc_mean_return", "bc_win_rate"} <= set(ev.metrics)
