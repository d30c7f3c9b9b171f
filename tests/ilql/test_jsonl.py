"""`task = "jsonl"`: a person's own episodes — validation naming line and field, streaming into the
store, the same MDP as the built-in Wordle task, held-out scoring without an env, text-env evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.ilql.agent import ILQLAgent
from agents.ilql.tasks import make_task
from agents.ilql.tasks.wordle import Wordle, write_jsonl
from evo.agent import AgentContext
from evo.replay import build_replay
from tests.conftest import run_evo

ARCH = {"n_layer": 1, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64}
GOOD = {"segments": [{"role": "env", "text": ">"}, {"role": "agent", "text": "about", "reward": -1.0},
                     {"role": "env", "text": "22222"}], "terminal": True}


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("jsonl") / "games.jsonl"
    write_jsonl(path, n_games=120, seed=3)
    return path


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _bad(**change) -> str:
    rec = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        if key.startswith("seg1_"):
            rec["segments"][1][key[5:]] = value
        else:
            rec[key] = value
    return json.dumps(rec)


@pytest.mark.parametrize("line, field, message", [
    ("{not json", "", "malformed JSON"),
    ('["a list"]', "", "expected a JSON object"),
    (json.dumps({"terminal": True}), "segments", "missing key"),
    (json.dumps({"segments": GOOD["segments"]}), "terminal", "missing key"),
    (_bad(segments=[]), "segments", "non-empty list"),
    (_bad(segments=[{"role": "env", "text": "only the environment"}]), "segments", "at least one agent segment"),
    (_bad(seg1_reward=float("nan")), r"segments\[1\].reward", "finite number, found nan"),
    (_bad(seg1_reward=float("inf")), r"segments\[1\].reward", "finite number, found inf"),
    (_bad(seg1_reward="-1"), r"segments\[1\].reward", "finite number"),
    (_bad(seg1_role="user"), r"segments\[1\].role", "'env' or 'agent'"),
    (_bad(seg1_text=""), r"segments\[1\].text", "empty string"),
    (_bad(seg1_rewrad=1.0), r"segments\[1\].rewrad", "unknown key"),
    (_bad(terminal="yes"), "terminal", "true or false"),
])
def test_a_malformed_record_is_named_by_line_and_field(tmp_path, line, field, message):
    path = _write(tmp_path, [json.dumps(GOOD), "", line])  # the blank line 2 is skipped; the bad one is line 3
    with pytest.raises(ValueError, match=rf"task.path: .*data.jsonl line 3{', ' + field if field else ''}: .*{message}"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(path)})


def test_text_the_tokenizer_cannot_encode_is_refused(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), _bad(seg1_text="abou!")])
    with pytest.raises(ValueError, match=r"line 2, segments\[1\].text: the char tokenizer .* cannot encode '!'"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(path), "chars": ">2about"})
    # a Hugging Face tokenizer that maps unknown words to its unk token
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, ">": 2, "about": 3, "22222": 4}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>").save_pretrained(tmp_path / "tok")
    with pytest.raises(ValueError, match=r"line 2, segments\[1\].text: the tokenizer cannot encode 'abou!'.*unknown token"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(path), "tokenizer": str(tmp_path / "tok")})


def test_table_errors_name_the_key(tmp_path, games):
    with pytest.raises(ValueError, match="task.path: expected a JSONL file, found 'missing.jsonl'"):
        ILQLAgent.validate_task({"task": "jsonl", "path": "missing.jsonl"})
    with pytest.raises(ValueError, match="task.max_tokens: an episode .* needs 62, more than max_tokens = 20"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "max_tokens": 20})
    with pytest.raises(ValueError, match="task.env: cannot import 'nowhere.mod:Env'"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "env": "nowhere.mod:Env"})
    with pytest.raises(ValueError, match="task.eval_rows: without an env, expected between 1 and half"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "eval_rows": 100})
    with pytest.raises(ValueError, match="task.tokenizer: expected 'char' or a local Hugging Face tokenizer directory"):
        ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "tokenizer": str(tmp_path / "nothing")})


def test_rows_stream_into_the_store_and_match_the_built_in_wordle_mdp(games):
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "chunk_rows": 32})
    spec = ILQLAgent.replay_spec(task)
    stream = spec.initial_rows()
    assert not isinstance(stream, dict)  # chunks, not the whole file
    chunks = list(stream)
    assert [len(c["tokens"]) for c in chunks] == [32, 32, 32, 24]
    store = build_replay(spec, 0, distributed=False)
    assert len(store) == 120 == task["scan"]["n_episodes"]

    jt, built_in = make_task(task), Wordle(n_games=120, seed=3)
    rows = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    for i, ep in enumerate(built_in.episodes()):
        n, a = len(ep.tokens), len(ep.action_idxs)
        # same text after the BOS token, same actions one position later, same rewards
        assert jt.tokenizer.decode(rows["tokens"][i, 1:n + 1].tolist()) == built_in.tokenizer.decode(ep.tokens)
        assert rows["action_idxs"][i, :a].tolist() == [p + 1 for p in ep.action_idxs]
        assert rows["rewards"][i, :a].tolist() == ep.rewards and rows["action_mask"][i].sum() == a
        assert rows["terminals"][i, a] and not rows["terminals"][i, :a].any()


def test_rows_equal_the_episode_by_episode_encoding(tmp_path):
    from agents.ilql.data import episodes_to_arrays
    from agents.ilql.tasks.jsonl import _encode_records, encode_episode, read_records

    cut = {"segments": [{"role": "agent", "text": "ab", "reward": 0.5}, {"role": "env", "text": ""},
                        {"role": "agent", "text": "c", "reward": 2}], "terminal": False}
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps(cut), _bad(seg1_text="b", seg1_reward=-3)])
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(path)})
    jt = make_task(task)
    rows = next(jt.iter_arrays())
    records = list(read_records(path))
    episodes = [encode_episode(r, ids, jt.tokenizer.bos_id)
                for r, ids in zip(records, _encode_records(path, records, jt.tokenizer))]
    expected = episodes_to_arrays(episodes, jt.max_tokens, jt.max_actions)
    assert set(rows) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(rows[key], value, err_msg=key)
    assert not rows["terminals"][1, 3] and rows["rewards"][1].tolist()[:3] == [0.0, 0.5, 2.0]


def test_a_validated_table_is_not_rescanned_until_the_file_changes(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD)] * 4)
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(path)})
    assert ILQLAgent.validate_task(task)["scan"] is task["scan"]
    path.write_text(path.read_text() + _bad(seg1_reward="x") + "\n")
    with pytest.raises(ValueError, match="line 5"):
        ILQLAgent.validate_task(task)


def test_without_an_env_members_are_scored_on_rows_they_never_train_on(games):
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "eval_rows": 20})
    store = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    ctx = AgentContext(task=task, replay=store, seed=0)
    agent = ILQLAgent.create(ILQLAgent.validate_arch(ARCH), {"batch_size": 16}, seed=1, index=0, context=ctx)
    held = set(make_task(task).heldout.tolist())
    assert len(held) == 20
    drawn = agent.ilql.sample_fn(2000, np.random.default_rng(0))["row"]
    assert not held & set(drawn.tolist())
    before = agent.evaluate()
    agent.train(30)
    after = agent.evaluate()
    assert before.fitness == -before.metrics["heldout_loss"] and after.fitness > before.fitness


def test_a_text_env_evaluates_members_by_acting(games):
    task = ILQLAgent.validate_task({"task": "jsonl", "path": str(games), "env": "agents.ilql.tasks.wordle:WordleTextEnv",
                                    "env_kwargs": {"n_words": 64}, "eval_episodes": 8, "eval_bc": True})
    store = build_replay(ILQLAgent.replay_spec(task), 0, distributed=False)
    ctx = AgentContext(task=task, replay=store, seed=0)
    torch.manual_seed(0)
    agent = ILQLAgent.create(ILQLAgent.validate_arch(ARCH), {"batch_size": 16}, seed=1, index=0, context=ctx)
    agent.train(2)
    ev = agent.evaluate()
    assert -6.0 <= ev.fitness <= -1.0 and ev.fitness == ev.metrics["mean_return"]
    assert 1.0 <= ev.metrics["mean_turns"] <= 6.0 and "bc_mean_return" in ev.metrics
    assert agent.evaluate() == ev  # evaluation noise is seeded: the same member scores the same


def test_a_bad_file_stops_evo_run_before_anything_is_created(tmp_path):
    data = _write(tmp_path, [json.dumps(GOOD), _bad(seg1_reward=float("nan"))])
    (tmp_path / "exp.toml").write_text(f"""
name = "bad_jsonl"
backend = "inline"
[population]
size = 2
generations = 1
steps_per_generation = 1
[agent]
kind = "ilql"
[agent.task]
task = "jsonl"
path = "{data}"
eval_rows = 1
""")
    proc = run_evo(["run", "exp.toml", "--runs-dir", "runs"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "agent.task.path" in proc.stderr and "line 2, segments[1].reward: expected a finite number" in proc.stderr
    assert not (tmp_path / "runs").exists()
