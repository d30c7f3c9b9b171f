"""`task = "jsonl"`: ILQL on a person's own offline data, one episode per line of a JSONL file.

    {"segments": [{"role": "env", "text": ">"},
                  {"role": "agent", "text": "about", "reward": -1.0},
                  {"role": "env", "text": "00120"}, ...],
     "terminal": true}

`env` segments are what the environment wrote (states, observations: transition tokens that Q
never treats as actions); `agent` segments are the agent's actions, each with the reward that
followed it (placed on the segment's last token; its other tokens get 0). `terminal` says whether
the episode ended (false: it was cut short, and its last state bootstraps from V). A top-level
`meta` value is allowed and ignored. Every episode starts with the tokenizer's BOS token, so an
agent segment may come first.

The file is read as a stream, never whole: `scan` validates every line (naming the line and the
field of the first malformed record) and measures it; `iter_arrays` then encodes it chunk by
chunk into padded replay rows for the shared store.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.ilql.data import Episode, validate_dataset
from agents.ilql.tokenizer import TextTokenizer

__all__ = ["JSONL_DEFAULTS", "JsonlTask", "Scan", "scan", "fingerprint", "read_records", "encode_episode",
           "validate_settings"]

JSONL_DEFAULTS: dict[str, Any] = {
    "path": "",            # the JSONL file (relative to the directory evo runs in)
    "tokenizer": "char",   # "char" or a local Hugging Face tokenizer directory
    "chars": "",           # the char tokenizer's alphabet; "" = every character the file uses
    "max_tokens": 0,       # row length in tokens (BOS included); 0 = the longest episode's
    "max_actions": 0,      # action slots per row; 0 = the most any episode has
    "env": "",             # "package.module:Class", a text environment that evaluates members; "" = held-out loss
    "env_kwargs": {},
    "eval_episodes": 16,   # environment episodes per evaluation (seeds 0 … n−1, the same for every member)
    "eval_rows": 0,        # without env: rows held out of training, scored instead; 0 = a tenth of the file, at most 256
    "chunk_rows": 4096,    # rows encoded and inserted into the store at a time
}

_ROLES = ("env", "agent")
_EPISODE_KEYS = {"segments", "terminal"}
_SEGMENT_KEYS = {"env": {"role", "text"}, "agent": {"role", "text", "reward"}}


class RecordError(ValueError):
    """A malformed line: `str()` names the file, the line and the field."""


@dataclass
class Record:
    line: int
    segments: list[tuple[str, str, float]]   # (role, text, reward); reward 0 for env segments
    terminal: bool


def fingerprint(path: str | Path) -> str:
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def _fail(path: Path, line: int, field: str, message: str) -> RecordError:
    where = f"{path} line {line}" + (f", {field}" if field else "")
    return RecordError(f"task.path: {where}: {message}")


def _parse(path: Path, line_no: int, line: str) -> Record | None:
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _fail(path, line_no, "",
                    f"expected one JSON object, found malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(rec, dict):
        raise _fail(path, line_no, "", f"expected a JSON object with keys {sorted(_EPISODE_KEYS)}, found {type(rec).__name__}")
    missing = sorted(_EPISODE_KEYS - set(rec))
    if missing:
        raise _fail(path, line_no, missing[0], f"missing key (an episode needs {sorted(_EPISODE_KEYS)})")
    unknown = sorted(set(rec) - _EPISODE_KEYS - {"meta"})
    if unknown:
        raise _fail(path, line_no, unknown[0], f"unknown key; expected {sorted(_EPISODE_KEYS)} (and optionally meta)")
    if not isinstance(rec["terminal"], bool):
        raise _fail(path, line_no, "terminal", f"expected true or false, found {rec['terminal']!r}")
    segs = rec["segments"]
    if not isinstance(segs, list) or not segs:
        raise _fail(path, line_no, "segments", f"expected a non-empty list of segments, found {segs!r}")
    out: list[tuple[str, str, float]] = []
    agents = 0
    for i, seg in enumerate(segs):
        # the well-formed case in a few type checks; anything else takes `_segment`'s full check and error
        if type(seg) is dict and type(seg.get("text")) is str:
            role, text = seg.get("role"), seg["text"]
            if role == "env" and len(seg) == 2:
                out.append((role, text, 0.0))
                continue
            r = seg.get("reward")
            if role == "agent" and len(seg) == 3 and text and type(r) in (float, int) and math.isfinite(r):
                out.append((role, text, float(r)))
                agents += 1
                continue
        _segment(path, line_no, i, seg)
    if not agents:
        raise _fail(path, line_no, "segments", "expected at least one agent segment (an episode without actions teaches nothing)")
    return Record(line_no, out, rec["terminal"])


def _segment(path: Path, line_no: int, i: int, seg: Any) -> None:
    """Raise the error that names what is wrong with a malformed segment."""
    name = f"segments[{i}]"
    if not isinstance(seg, dict):
        raise _fail(path, line_no, name, f"expected an object with role and text, found {seg!r}")
    role = seg.get("role")
    if role not in _ROLES:
        raise _fail(path, line_no, f"{name}.role", f"expected 'env' or 'agent', found {role!r}")
    missing = sorted(_SEGMENT_KEYS[role] - set(seg))
    if missing:
        raise _fail(path, line_no, f"{name}.{missing[0]}", f"missing key (a {role} segment needs {sorted(_SEGMENT_KEYS[role])})")
    unknown = sorted(set(seg) - _SEGMENT_KEYS[role])
    if unknown:
        raise _fail(path, line_no, f"{name}.{unknown[0]}",
                    f"unknown key for a {role} segment; expected {sorted(_SEGMENT_KEYS[role])}")
    text = seg["text"]
    if not isinstance(text, str):
        raise _fail(path, line_no, f"{name}.text", f"expected a string, found {text!r}")
    if not text:
        raise _fail(path, line_no, f"{name}.text", "expected the action's text, found an empty string")
    raise _fail(path, line_no, f"{name}.reward", f"expected a finite number, found {seg['reward']!r}")


def read_records(path: str | Path) -> Iterator[Record]:
    """Every episode of the file, validated line by line (blank lines are skipped)."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            rec = _parse(path, line_no, line)
            if rec is not None:
                yield rec


def _batches(path: str | Path, size: int) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for rec in read_records(path):
        batch.append(rec)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode_records(path: Path, records: list[Record], tok: TextTokenizer) -> list[list[list[int]]]:
    """Token ids of every segment, refusing text the tokenizer cannot encode."""
    texts = [text for rec in records for _, text, _ in rec.segments]
    ids = tok.encode_batch(texts)
    out, k = [], 0
    for rec in records:
        seg_ids = ids[k:k + len(rec.segments)]
        k += len(rec.segments)
        for i, ((_, text, _), tids) in enumerate(zip(rec.segments, seg_ids)):
            if text and not tids:
                raise _fail(path, rec.line, f"segments[{i}].text", f"the tokenizer encodes {text[:40]!r} to no tokens")
            if tok.unk_id is not None and tok.unk_id in tids and (tok.unk_text or "") not in text:
                raise _fail(path, rec.line, f"segments[{i}].text",
                            f"the tokenizer cannot encode {text[:40]!r} (it becomes the unknown token {tok.unk_text!r})")
        out.append(seg_ids)
    return out


def encode_episode(rec: Record, seg_ids: list[list[int]], bos_id: int) -> Episode:
    """The per-token MDP of one record: BOS, then segments; an action's reward sits on its last token."""
    tokens = [bos_id]
    action_idxs: list[int] = []
    rewards: list[float] = []
    for (role, _, reward), ids in zip(rec.segments, seg_ids):
        if role == "agent":
            for j, t in enumerate(ids):
                action_idxs.append(len(tokens) - 1)
                tokens.append(t)
                rewards.append(reward if j == len(ids) - 1 else 0.0)
        else:
            tokens.extend(ids)
    return Episode(tokens=tokens, action_idxs=action_idxs, rewards=rewards, done=rec.terminal)


def _rows(records: list[Record], seg_ids: list[list[list[int]]], bos_id: int, max_tokens: int,
          max_actions: int) -> dict[str, np.ndarray]:
    """Padded replay rows straight from the segments (the layout of `agents.ilql.data`, which
    `encode_episode` + `episodes_to_arrays` also build, one Episode at a time)."""
    n = len(records)
    tokens = np.zeros((n, max_tokens), np.int64)
    lengths = np.zeros(n, np.int64)
    action_idxs = np.zeros((n, max_actions), np.int64)
    n_actions = np.zeros(n, np.int64)
    rewards = np.zeros((n, max_actions), np.float32)
    tokens[:, 0] = bos_id
    for i, (rec, ids) in enumerate(zip(records, seg_ids)):
        pos, a = 1, 0
        for (role, _, reward), s in zip(rec.segments, ids):
            k = len(s)
            if pos + k > max_tokens or (role == "agent" and a + k > max_actions):
                raise _fail(Path("<file changed since it was scanned>"), rec.line, "", "episode longer than the scan found")
            tokens[i, pos:pos + k] = s
            if role == "agent":
                action_idxs[i, a:a + k] = np.arange(pos - 1, pos - 1 + k)
                rewards[i, a + k - 1] = reward
                a += k
            pos += k
        lengths[i], n_actions[i] = pos, a
    slots = np.arange(max_actions)
    action_mask = slots[None, :] < n_actions[:, None]
    state_idxs = np.concatenate([np.where(action_mask, action_idxs, (lengths - 1)[:, None]), (lengths - 1)[:, None]], 1)
    terminals = np.ones((n, max_actions + 1), bool)
    terminals[:, :max_actions] = ~action_mask
    terminals[np.arange(n), n_actions] = [rec.terminal for rec in records]
    return validate_dataset({
        "tokens": tokens, "attn_mask": np.arange(max_tokens)[None, :] < lengths[:, None], "action_idxs": action_idxs,
        "state_idxs": state_idxs, "rewards": rewards, "terminals": terminals, "action_mask": action_mask})


@dataclass
class Scan:
    """What one validating pass over the file found."""

    fingerprint: str
    n_episodes: int
    max_tokens: int
    max_actions: int
    chars: str       # the char tokenizer's alphabet ("" for a Hugging Face tokenizer)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _char_scan(path: Path, chars: str) -> tuple[int, int, int, str]:
    """One character is one token: lengths need no encoding; an explicit alphabet is enforced."""
    alphabet = set(chars)
    seen: set[str] = set()
    n = longest = most = 0
    for rec in read_records(path):
        n += 1
        tokens, actions = 1, 0
        for i, (role, text, _) in enumerate(rec.segments):
            if chars:
                bad = set(text) - alphabet
                if bad:
                    raise _fail(path, rec.line, f"segments[{i}].text",
                                f"the char tokenizer (task.chars) cannot encode {''.join(sorted(bad))!r}")
            else:
                seen.update(text)
            tokens += len(text)
            actions += len(text) if role == "agent" else 0
        longest, most = max(longest, tokens), max(most, actions)
    return n, longest, most, chars or "".join(sorted(seen))


def _token_scan(path: Path, tok: TextTokenizer, chunk: int) -> tuple[int, int, int]:
    n = longest = most = 0
    for records in _batches(path, chunk):
        for rec, seg_ids in zip(records, _encode_records(path, records, tok)):
            n += 1
            longest = max(longest, 1 + sum(len(ids) for ids in seg_ids))
            most = max(most, sum(len(ids) for (role, _, _), ids in zip(rec.segments, seg_ids) if role == "agent"))
    return n, longest, most


def scan(settings: dict[str, Any]) -> Scan:
    """Validate every line of `settings['path']` and measure it; raises on the first malformed record."""
    path = Path(settings["path"])
    if not path.is_file():
        raise ValueError(f"task.path: expected a JSONL file, found {str(path)!r} (no such file)")
    fp = fingerprint(path)
    if settings["tokenizer"] == "char":
        n, longest, most, chars = _char_scan(path, settings["chars"])
        if len(set(chars)) != len(chars):
            raise ValueError(f"task.chars: expected distinct characters, found {chars!r}")
    else:
        n, longest, most = _token_scan(path, TextTokenizer.from_dir(settings["tokenizer"]), settings["chunk_rows"])
        chars = ""
    if n == 0:
        raise ValueError(f"task.path: expected at least one episode in {path}, found none")
    for key, found in (("max_tokens", longest), ("max_actions", most)):
        cap = settings[key]
        if cap and found > cap:
            raise ValueError(f"task.{key}: an episode of {path} needs {found}, more than {key} = {cap} "
                             f"(raise it, or 0 to fit the longest)")
    return Scan(fp, n, settings["max_tokens"] or longest, settings["max_actions"] or most, chars)


def validate_settings(settings: dict[str, Any], previous_scan: Any = None) -> dict[str, Any]:
    """Check a `jsonl` table (types already checked) and scan its file; a `previous_scan` whose
    fingerprint still matches the file is kept, so workers and repeated calls never re-read it."""
    out = dict(settings)
    if not out["path"]:
        raise ValueError("task.path: expected the JSONL file of episodes, found nothing")
    out["path"] = str(Path(out["path"]).expanduser().resolve())
    if out["tokenizer"] != "char":
        out["tokenizer"] = str(Path(out["tokenizer"]).expanduser().resolve())
    elif not isinstance(out["chars"], str):
        raise ValueError(f"task.chars: expected a string of characters, found {out['chars']!r}")
    if out["chunk_rows"] < 1:
        raise ValueError(f"task.chunk_rows: expected a positive integer, found {out['chunk_rows']}")
    if out["env"]:
        from agents.ilql.tasks.textenv import env_factory

        env_factory(out["env"], out["env_kwargs"])
        if out["eval_episodes"] < 1:
            raise ValueError(f"task.eval_episodes: expected at least 1 with an env, found {out['eval_episodes']}")
    elif out["env_kwargs"]:
        raise ValueError("task.env_kwargs: given without task.env")
    if not Path(out["path"]).is_file():
        raise ValueError(f"task.path: expected a JSONL file, found {settings['path']!r} (no such file)")
    keys = ("path", "tokenizer", "chars", "max_tokens", "max_actions")
    if (isinstance(previous_scan, dict) and previous_scan.get("fingerprint") == fingerprint(out["path"])
            and previous_scan.get("settings") == {k: out[k] for k in keys}):
        out["scan"] = previous_scan
    else:
        out["scan"] = {**scan(out).to_json(), "settings": {k: out[k] for k in keys}}
    n = out["scan"]["n_episodes"]
    if not out["env"] and not out["eval_rows"]:
        out["eval_rows"] = max(1, min(256, n // 10))
    if not out["env"] and not 1 <= out["eval_rows"] <= n // 2:
        raise ValueError(f"task.eval_rows: without an env, expected between 1 and half the file's {n} episodes "
                         f"(rows held out of training to score members), found {out['eval_rows']}")
    return out


def heldout_rows(n_episodes: int, eval_rows: int) -> np.ndarray:
    """The rows held out of training when there is no env: the same for every member and run."""
    return np.sort(np.random.default_rng(0).choice(n_episodes, size=eval_rows, replace=False))


class JsonlTask:
    """The task object for a validated `jsonl` table (with its `scan`): tokenizer, shapes, rows, evaluation."""

    fitness_metric = "mean_return"

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        s = settings["scan"]
        self.path = Path(settings["path"])
        self.n_episodes, self.max_tokens, self.max_actions = s["n_episodes"], s["max_tokens"], s["max_actions"]
        if settings["tokenizer"] == "char":
            self.tokenizer = TextTokenizer.char(s["chars"])
        else:
            self.tokenizer = TextTokenizer.from_dir(settings["tokenizer"])
        self.vocab_size = self.tokenizer.vocab_size
        self.env_factory = None
        if settings["env"]:
            from agents.ilql.tasks.textenv import env_factory

            self.env_factory = env_factory(settings["env"], settings["env_kwargs"])

    @property
    def heldout(self) -> np.ndarray:
        """Rows never trained on (scored instead) when there is no env; empty with an env."""
        if self.env_factory is not None:
            return np.zeros(0, np.int64)
        return heldout_rows(self.n_episodes, self.settings["eval_rows"])

    def iter_arrays(self, chunk_rows: int | None = None, row_field: str | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The file as padded replay rows, `chunk_rows` episodes at a time (`row_field`: each row's position)."""
        start = 0
        for records in _batches(self.path, chunk_rows or self.settings["chunk_rows"]):
            seg_ids = _encode_records(self.path, records, self.tokenizer)
            arrays = _rows(records, seg_ids, self.tokenizer.bos_id, self.max_tokens, self.max_actions)
            if row_field is not None:
                arrays[row_field] = np.arange(start, start + len(records), dtype=np.int64)
            start += len(records)
            yield arrays

    def arrays(self) -> dict[str, np.ndarray]:
        """The whole dataset in memory (for a learner without a replay store; small files only)."""
        chunks = list(self.iter_arrays())
        return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

    def evaluate(self, model, beta: float, samples: int = 1, temperature: float = 1.0, top_k: int = 0,
                 generator=None) -> dict[str, float]:
        """Play `eval_episodes` × `samples` episodes of the text environment with ILQL decoding."""
        from agents.ilql.tasks.textenv import play

        if self.env_factory is None:
            raise RuntimeError("JsonlTask.evaluate: no task.env; the agent scores held-out rows instead")
        seeds = [s for s in range(self.settings["eval_episodes"]) for _ in range(samples)]
        return play(model, self.tokenizer, self.env_factory, seeds, beta, temperature=temperature, top_k=top_k,
                    generator=generator, max_tokens=int(model.net_config["block_size"]))
