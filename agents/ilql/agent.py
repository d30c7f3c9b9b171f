"""`ILQLAgent`: the ILQL learner as an evo population member (the Agent protocol).

The engine creates members from (arch, hparams, seed), trains them on batches drawn from the
run's shared replay store (the task's offline dataset, declared by `replay_spec` and loaded once by the run),
evaluates them by decoding with β = inference_beta, and mutates hyperparameters, depth / FF
width (function-preserving growth) and the MLP activation. Everything a member is travels in
`get_state()` as tensors + JSON: weights of every head (both Q heads and both targets), Adam
state, RNG states, counters, arch, hyperparameters and the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.ilql.data import episodes_to_arrays, replay_schema
from agents.ilql.ilql import ILQL
from agents.ilql.model import DEFAULT_NET_CONFIG, HF_ACTIVATIONS, check_net_config, resolve_pretrained
from agents.ilql.tasks import TASKS, make_task, task_defaults
from agents.ilql.tokenizer import TextTokenizer
from evo.agent import AgentContext, Evaluation, TorchAgent
from evo.evolvable import remap_optimizer
from evo.hparams import HParam
from evo.records import MutationRecord
from evo.replay import ReplaySpec
from evo.rng import evaluation_seed

__all__ = ["ILQLAgent", "ROW_FIELD"]

ROW_FIELD = "row"  # the row's position in the offline dataset: the dataset is a multiset of episodes

_EVAL_DEFAULTS = {"eval_samples": 8, "eval_temperature": 1.0, "eval_top_k": 1, "eval_bc": True}
_TASK_EXTRA = {"randomwalks": {"mask_invalid": True}, "wordle": {}, "jsonl": {}}

# hyperparameters that live in the loss config / learner rather than in the optimizer
_LOSS_HPARAMS = ("gamma", "tau", "beta", "cql_temp", "transition_weight", "clip_weight", "dm_margin",
                 "v_weight", "cql_weight", "awac_weight", "dm_weight")


def _n_rows(task: Any) -> int:
    return task.n_episodes if hasattr(task, "n_episodes") else len(task.episodes())


def _initial_rows(task: Any) -> Any:
    """The dataset for the store: a stream of chunks for a JSONL file, one mapping for a generated task."""
    return task.iter_arrays(row_field=ROW_FIELD) if hasattr(task, "iter_arrays") else _dataset_arrays(task)


def _dataset_arrays(task: Any) -> dict[str, np.ndarray]:
    arrays = episodes_to_arrays(task.episodes(), task.max_tokens, task.max_actions)
    arrays[ROW_FIELD] = np.arange(len(arrays["tokens"]), dtype=np.int64)
    return arrays


class ILQLAgent(TorchAgent):
    kind = "ilql"
    inference_hparams = frozenset({"inference_beta"})  # read only when decoding (evaluate, export)

    # ---- declarations ---------------------------------------------------------------------------
    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        return {
            "lr": HParam(1e-3, 1e-5, 1e-2, scale="log"),
            "batch_size": HParam(64, 16, 256, kind="int"),
            "alpha": HParam(0.05, 0.005, 0.5, scale="log"),          # Polyak rate of the target Q heads
            "tau": HParam(0.7, 0.5, 0.95),                            # expectile of the V loss
            "gamma": HParam(0.99, 0.9, 0.999),
            "beta": HParam(0.0),                                      # AWAC temperature in training
            "cql_weight": HParam(0.1, 0.001, 1.0, scale="log"),
            "inference_beta": HParam(10.0, 0.5, 100.0, scale="log"),  # β of decoding (the fitness policy)
            "v_weight": HParam(1.0),
            "awac_weight": HParam(1.0),
            "dm_weight": HParam(0.0),
            "dm_margin": HParam(0.0),
            "cql_temp": HParam(1.0),
            "transition_weight": HParam(0.0),
            "clip_weight": HParam(100.0),
            "weight_decay": HParam(0.0),
            "grad_clip": HParam(1.0),
        }

    @classmethod
    def default_arch(cls) -> dict[str, Any]:
        return dict(DEFAULT_NET_CONFIG)

    @classmethod
    def validate_arch(cls, arch: dict[str, Any]) -> dict[str, Any]:
        """net_config keys; vocab_size and block_size are raised to fit the task when the member is built
        (a `pretrained` checkpoint fixes its own: they are read from its config.json)."""
        return check_net_config(resolve_pretrained(arch))

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        name = task.get("task")
        if name not in TASKS:
            raise ValueError(f"task.task: expected one of {list(TASKS)}, found {name!r}")
        defaults = {**task_defaults(name), **_EVAL_DEFAULTS, **_TASK_EXTRA[name]}
        task = dict(task)
        previous_scan = task.pop("scan", None) if name == "jsonl" else None
        unknown = sorted(set(task) - set(defaults) - {"task"})
        if unknown:
            raise ValueError(f"task.{unknown[0]}: unknown key for task {name!r}; expected some of {sorted(defaults)}")
        out = {"task": name, **defaults, **task}
        for key, default in defaults.items():
            value = out[key]
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif isinstance(default, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            else:
                ok = isinstance(value, type(default))
            if not ok:
                raise ValueError(f"task.{key}: expected a non-negative {type(default).__name__}, found {value!r}")
        if name == "jsonl":
            from agents.ilql.tasks.jsonl import validate_settings

            return validate_settings(out, previous_scan)
        return out

    @classmethod
    def replay_spec(cls, task: dict[str, Any]) -> ReplaySpec:
        """The task's offline dataset, generated and loaded once into the shared store."""
        t = make_task(cls.validate_task(task))
        schema = replay_schema(t.max_tokens, t.max_actions, row_field=ROW_FIELD)
        return ReplaySpec(schema, capacity=_n_rows(t), sampler="uniform", initial_rows=lambda: _initial_rows(t))

    # ---- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def create(cls, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
               context: AgentContext) -> ILQLAgent:
        task_cfg = cls.validate_task(context.task)
        task = make_task(task_cfg)
        arch = dict(arch)
        if arch.get("pretrained"):
            _check_fits_pretrained(arch, task)
        else:
            arch["vocab_size"] = task.vocab_size
            arch["block_size"] = max(int(arch.get("block_size", 0)), task.max_tokens)
        hp = {name: h.value for name, h in cls.default_hparams().items()}
        hp.update(hparams)
        agent = cls.__new__(cls)
        agent.index, agent.context = index, context
        agent.hparams = hp
        agent.tokenizer_json = task.tokenizer.to_str()
        agent.tokenizer_special = task.tokenizer.special_json() if isinstance(task.tokenizer, TextTokenizer) else None
        dataset = context.replay if context.replay is not None else _local_dataset(task)
        agent.ilql = ILQL(dataset, check_net_config(arch), index=index, device=context.device, seed=seed,
                          **agent._ilql_kwargs(hp))
        agent.arch = agent.ilql.net_config
        agent._attach_sampler()
        return agent

    @staticmethod
    def _ilql_kwargs(hp: dict[str, Any]) -> dict[str, Any]:
        keys = ("batch_size", "lr", "alpha", "weight_decay", "grad_clip") + _LOSS_HPARAMS
        return {k: hp[k] for k in keys}

    def _attach_sampler(self) -> None:
        """Draw rows of the shared store by key with this member's own RNG (reproducible from its seed)."""
        task_cfg = self.validate_task(self.context.task)
        task = make_task(task_cfg)
        store = self.ilql.dataset
        if isinstance(store, dict) or store is None:
            return
        self.ilql.sample_fn = _KeyedSampler(store, task, _n_rows(task), exclude=getattr(task, "heldout", None))

    # TorchAgent's RNG lives in the learner
    @property
    def generator(self) -> torch.Generator:  # type: ignore[override]
        return self.ilql.generator

    @property
    def rng(self) -> np.random.Generator:  # type: ignore[override]
        return self.ilql.rng

    def init_rng(self, seed: int) -> None:
        """Re-seed the learner's streams (its training-row draws); `clone(index, seed)` calls this."""
        self.ilql.reseed(seed)

    def networks(self) -> dict[str, torch.nn.Module]:
        m = self.ilql.model
        nets = {"gpt": m.gpt, "q1": m.q1, "v": m.v}
        if m.q2 is not None:
            nets["q2"] = m.q2
        return nets

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.ilql.optimizer]

    def set_hparams(self, values: dict[str, Any]) -> None:
        super().set_hparams(values)
        for key, value in values.items():
            if key in _LOSS_HPARAMS:
                setattr(self.ilql.loss_cfg, key, value)
            elif key in ("batch_size",):
                self.ilql.batch_size = int(value)
            elif key in ("lr", "alpha", "weight_decay", "grad_clip"):
                setattr(self.ilql, key, value)

    # ---- train / evaluate -----------------------------------------------------------------------
    def train(self, steps: int) -> dict[str, float]:
        totals: dict[str, float] = {}
        for _ in range(steps):
            for k, v in self.ilql.learn().items():
                totals[k] = totals.get(k, 0.0) + v
        return {k: v / max(1, steps) for k, v in totals.items()}

    def evaluate(self) -> Evaluation:
        cfg = self.validate_task(self.context.task)
        task = make_task(cfg)
        if cfg["task"] == "jsonl" and task.env_factory is None:
            return self._heldout_evaluation(task)
        # sampling noise from (run seed, index, training progress) only, never from a call counter:
        # evaluate() changes nothing, so a checkpoint or an export evaluates exactly as the run did
        g = torch.Generator().manual_seed(evaluation_seed(self.context.seed, self.index, self.ilql.steps))
        kwargs = {k: cfg[k] for k in _TASK_EXTRA[cfg["task"]]}
        ilql = task.evaluate(self.ilql.model, float(self.hparams["inference_beta"]), samples=cfg["eval_samples"],
                             temperature=cfg["eval_temperature"], top_k=cfg["eval_top_k"], generator=g, **kwargs)
        metrics = dict(ilql)
        if cfg["eval_bc"]:
            bc = task.evaluate(self.ilql.model, 0.0, samples=cfg["eval_samples"], temperature=1.0, top_k=0,
                               generator=g, **kwargs)
            metrics.update({f"bc_{k}": v for k, v in bc.items()})
        metrics["train_steps"] = float(self.ilql.steps)
        return Evaluation(fitness=float(ilql[task.fitness_metric]), metrics=metrics)

    @torch.no_grad()
    def _heldout_evaluation(self, task: Any) -> Evaluation:
        """No environment to act in: fitness is minus the ILQL loss, under the default loss weights (the
        same for every member), on the rows held out of training. It ranks how well members model the
        data's values and actions, not how well they act; give task.env for that."""
        from agents.ilql.data import to_torch
        from agents.ilql.ilql import _trim
        from agents.ilql.losses import ILQLLossConfig, ilql_loss

        defaults = self.default_hparams()
        cfg = ILQLLossConfig(**{k: defaults[k].value for k in _LOSS_HPARAMS})
        rows = task.heldout
        sums: dict[str, float] = {}
        model = self.ilql.model
        was_training = model.training
        model.eval()
        for start in range(0, len(rows), 64):
            part = rows[start:start + 64]
            if isinstance(self.ilql.dataset, dict):
                data = {k: np.asarray(v)[part] for k, v in self.ilql.dataset.items()}
            else:
                data = self.ilql.dataset.get(self.ilql.sample_fn.keys[part])
            batch = _trim(to_torch(data, self.ilql.device))
            out = model(batch["tokens"], batch["state_idxs"], batch["action_idxs"], batch["attn_mask"])
            _, metrics = ilql_loss(out, batch, cfg)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * len(part)
        model.train(was_training)
        metrics = {f"heldout_{k}": v / len(rows) for k, v in sums.items()}
        metrics["train_steps"] = float(self.ilql.steps)
        return Evaluation(fitness=-metrics["heldout_loss"], metrics=metrics)

    # ---- mutation -------------------------------------------------------------------------------
    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        model, a = self.ilql.model, self.arch
        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        can_add, can_remove = model.n_layer < a["max_layers"], model.n_layer > a["min_layers"]
        if rng.random() < new_layer_prob:
            op = "add_layer" if can_add else "widen_ff"
        else:
            op = str(rng.choice(["remove_layer", "widen_ff"])) if can_remove else "widen_ff"
        if op == "add_layer":
            position = int(rng.integers(0, model.n_layer + 1))
            n_layer = model.n_layer
            change = model.add_layer(position, generator=g)
            record = MutationRecord("add_layer", {"n_layer": [n_layer, model.n_layer]}, True, {"position": position})
        elif op == "remove_layer":
            n_layer = model.n_layer
            position, change = model.remove_layer()
            record = MutationRecord("remove_layer", {"n_layer": [n_layer, model.n_layer]}, False,
                                    {"position": position, "reason": "dropped the block with the smallest residual outputs"})
        else:
            old = a["dim_feedfwd"]
            extra = max(8, (old // 4) // 8 * 8)
            change = model.widen_ff(extra, generator=g)
            record = MutationRecord("widen_ff", {"dim_feedfwd": [old, model.net_config["dim_feedfwd"]]}, True)
        remap_optimizer(self.ilql.optimizer, change)
        self.arch = model.net_config
        return record

    def set_activation(self, name: str) -> MutationRecord:
        old = self.arch["activation"]
        remap_optimizer(self.ilql.optimizer, self.ilql.model.set_activation(name))
        self.arch = self.ilql.model.net_config
        return MutationRecord("set_activation", function_preserving=old == name)

    # ---- state ----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "arch": json.dumps(self.arch),
            "hparams": json.dumps(self.hparams),
            "tokenizer": self.tokenizer_json,
            **({"tokenizer_special": self.tokenizer_special} if self.tokenizer_special else {}),
            "ilql": self.ilql.get_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> ILQLAgent:
        agent = cls.__new__(cls)
        agent.index = int(state["index"])
        agent.context = context
        agent.hparams = json.loads(state["hparams"])
        agent.tokenizer_json = state["tokenizer"]
        agent.tokenizer_special = state.get("tokenizer_special")
        dataset = context.replay
        if dataset is None and context.task:
            dataset = _local_dataset(make_task(cls.validate_task(context.task)))
        agent.ilql = ILQL.from_state(state["ilql"], dataset, device=context.device)
        agent.ilql.index = agent.index
        agent.arch = agent.ilql.net_config
        if context.task:
            agent._attach_sampler()
        return agent

    # ---- export ---------------------------------------------------------------------------------
    def export(self, out_dir: str | Path, info: dict[str, Any] | None = None) -> Path:
        """(a) the full agent (safetensors + JSON) and (b) `hf/`: the policy as a Hugging Face model + tokenizer."""
        out = super().export(out_dir, info)
        activation = self.arch["activation"]
        if activation not in HF_ACTIVATIONS:
            raise ValueError(f"export: activation {activation!r} has no Hugging Face equivalent; the policy can be "
                             f"exported with one of {sorted(HF_ACTIVATIONS)} (the full agent was written to {out})")
        gpt = self.ilql.model.gpt
        gpt.config.use_cache = True
        try:
            gpt.save_pretrained(out / "hf", safe_serialization=True)
        finally:
            gpt.config.use_cache = False
        TextTokenizer.from_json(self.tokenizer_json, self.tokenizer_special).hf().save_pretrained(out / "hf")
        return out


def _check_fits_pretrained(arch: dict[str, Any], task: Any) -> None:
    """A pretrained backbone keeps its vocabulary and positions: the task's tokens must fit them."""
    if task.vocab_size > arch["vocab_size"]:
        raise ValueError(f"arch.pretrained: the model's vocabulary has {arch['vocab_size']} tokens, the task's tokenizer "
                         f"{task.vocab_size} (use the model's own tokenizer: task.tokenizer = its directory)")
    if task.max_tokens > arch["block_size"]:
        raise ValueError(f"arch.pretrained: the model has {arch['block_size']} positions, the task's episodes need "
                         f"{task.max_tokens} tokens")


def _local_dataset(task: Any) -> dict[str, np.ndarray]:
    if hasattr(task, "arrays"):
        return task.arrays()
    arrays = _dataset_arrays(task)
    arrays.pop(ROW_FIELD)
    return arrays


class _KeyedSampler:
    """Uniform rows of the shared store, drawn with the member's RNG and fetched by key."""

    def __init__(self, store: Any, task: Any, n_rows: int, exclude: np.ndarray | None = None) -> None:
        self.store = store
        schema = replay_schema(task.max_tokens, task.max_actions, row_field=ROW_FIELD)
        keys = []
        for start in range(0, n_rows, 4096):  # rows are keyed by position alone: hash blank rows, a chunk at a time
            rows = np.arange(start, min(start + 4096, n_rows), dtype=np.int64)
            probe = {name: np.zeros((len(rows), *f.shape), f.np_dtype) for name, f in schema.fields.items()}
            probe[ROW_FIELD] = rows
            keys.append(np.asarray(store.hash(probe), dtype=np.uint64))
        self.keys = np.concatenate(keys)
        # rows held out of training (scored instead); none for the generated tasks
        self.train_rows = None if exclude is None or not len(exclude) else np.setdiff1d(np.arange(n_rows), exclude)

    def __call__(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self.train_rows is None:
            rows = rng.integers(len(self.keys), size=n)
        else:
            rows = self.train_rows[rng.integers(len(self.train_rows), size=n)]
        return self.store.get(self.keys[rows])

