"""`arch.pretrained`: a GPT-2 saved with `save_pretrained` in a temp directory (the real loading path,
no hub), its own byte-level BPE tokenizer, fine-tuned on JSONL episodes; every evolvable operation
keeps working and the export loads with AutoModelForCausalLM / AutoTokenizer offline."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from agents.ilql.agent import ILQLAgent
from agents.ilql.data import to_torch
from agents.ilql.tasks.wordle import Wordle, write_jsonl
from evo.agent import AgentContext
from evo.checkpoint import load_state, save_state
from evo.replay import build_replay


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny GPT-2 and a BPE tokenizer trained on Wordle text, saved as a Hugging Face directory."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("gpt2") / "tiny-gpt2"
    w = Wordle(n_games=60)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([json.dumps(w.game_record(a, g)) for a, g in w.games], vocab_size=300,
                            special_tokens=["<|endoftext|>"])
    eot = "<|endoftext|>"
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=eot, eos_token=eot, unk_token=eot).save_pretrained(out)
    config = GPT2Config(vocab_size=300, n_positions=96, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def context(model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("data") / "games.jsonl"
    write_jsonl(data, n_games=80, seed=1)
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(data), "tokenizer": str(model_dir),
                                    "env": "agents.ilql.tasks.wordle:WordleTextEnv", "eval_episodes": 4})
    store = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    return AgentContext(task=task, replay=store, seed=0)


def _member(model_dir, context, **arch):
    arch = ILQLAgent.validate_arch({"pretrained": str(model_dir), "max_layers": 3, **arch})
    return ILQLAgent.create(arch, {"batch_size": 8, "lr": 1e-3}, seed=2, index=0, context=context)


def _outputs(agent, n=6):
    m = agent.ilql.model
    m.eval()
    b = to_torch(agent.ilql.sample_fn(n, np.random.default_rng(7)))
    with torch.no_grad():
        out = m(b["tokens"], b["state_idxs"], b["action_idxs"], b["attn_mask"])
    return [out["logits"], out["vs"], *out["qs"], *out["target_qs"]]


def test_arch_is_read_from_the_checkpoint(model_dir):
    arch = ILQLAgent.validate_arch({"pretrained": str(model_dir)})
    assert (arch["n_layer"], arch["n_embd"], arch["n_head"], arch["dim_feedfwd"]) == (2, 32, 2, 128)
    assert (arch["vocab_size"], arch["block_size"], arch["activation"]) == (300, 96, "GELUTanh")
    assert (arch["min_layers"], arch["max_layers"]) == (1, 4)
    with pytest.raises(ValueError, match="arch.n_embd: the pretrained model in .* has 32, found 64"):
        ILQLAgent.validate_arch({"pretrained": str(model_dir), "n_embd": 64})
    with pytest.raises(ValueError, match="arch.pretrained: expected a local Hugging Face model directory"):
        ILQLAgent.validate_arch({"pretrained": str(model_dir / "nothing")})


def test_a_member_starts_from_the_pretrained_weights_and_learns(model_dir, context):
    from transformers import GPT2LMHeadModel

    ref = GPT2LMHeadModel.from_pretrained(str(model_dir), local_files_only=True)
    agent = _member(model_dir, context)
    for name, p in ref.state_dict().items():
        assert torch.equal(agent.ilql.model.gpt.state_dict()[name], p), name
    first = agent.train(1)["loss"]
    assert np.isfinite(first) and agent.train(20)["loss"] < first


def test_evolvable_operations_work_on_the_pretrained_backbone(model_dir, context):
    agent = _member(model_dir, context)
    agent.train(2)
    base = _outputs(agent)
    rng = np.random.default_rng(0)
    rec = agent.mutate_architecture(rng, new_layer_prob=1.0)
    assert rec.op == "add_layer" and rec.function_preserving and agent.arch["n_layer"] == 3
    for a, b in zip(base, _outputs(agent)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    rec = agent.mutate_architecture(rng, new_layer_prob=1.0)  # at max_layers = 3: widens instead
    assert rec.op == "widen_ff" and agent.arch["dim_feedfwd"] == 160
    for a, b in zip(base, _outputs(agent)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    agent.train(2)  # the optimizer follows the new shapes
    while agent.arch["n_layer"] > agent.arch["min_layers"]:
        assert agent.mutate_architecture(rng, new_layer_prob=0.0).op in ("remove_layer", "widen_ff")
    assert agent.arch["n_layer"] == 1 and agent.ilql.model.n_layer == 1
    agent.set_activation("ReLU")
    agent.train(2)


def test_state_round_trip_needs_no_checkpoint_directory(model_dir, context, tmp_path):
    agent = _member(model_dir, context)
    agent.train(2)
    agent.mutate_architecture(np.random.default_rng(1), new_layer_prob=1.0)
    save_state(tmp_path / "s", agent.get_state())
    state, _ = load_state(tmp_path / "s")
    moved = model_dir.with_name("moved-away")
    shutil.move(model_dir, moved)
    try:
        twin = ILQLAgent.from_state(state, context)
    finally:
        shutil.move(moved, model_dir)
    for a, b in zip(_outputs(agent), _outputs(twin)):
        assert torch.equal(a, b)
    assert twin.arch == agent.arch
    torch.manual_seed(5)  # GPT-2's dropout: the same draws for both
    trained = twin.train(2)
    torch.manual_seed(5)
    assert trained == agent.train(2)


def test_export_loads_with_auto_classes_offline_and_generates(model_dir, context, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    agent = _member(model_dir, context)
    agent.train(3)
    agent.mutate_architecture(np.random.default_rng(0), new_layer_prob=1.0)
    out = agent.export(tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(out / "hf", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out / "hf", local_files_only=True)
    ids = tok(">about", return_tensors="pt").input_ids
    model.eval()
    agent.ilql.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, agent.ilql.model.gpt(ids).logits, atol=1e-6, rtol=0)
    generated = model.generate(ids, max_new_tokens=6, do_sample=False)[0]
    assert generated.shape[0] == ids.shape[1] + 6 and tok.decode(generated).startswith(">about")
