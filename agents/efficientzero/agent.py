"""EfficientZero as an evo population member: the wiring.

The agent declares what may evolve (hyperparameters, architecture knobs and their bounds), checks
the experiment's tables, and owns the member's state: model, target model, Adam, RNGs, counters.
The work is done elsewhere:

* `selfplay.SelfPlay` collects game segments into the run's shared replay and plays evaluation
  episodes;
* `learner` samples sequence windows, builds targets and takes one gradient step
  (`learner.update`, whose loss `learner.loss_terms` is a pure function of parameters);
* the model variant (`model.EfficientZeroMLP` / `EfficientZeroConv`) applies its own
  architecture mutations.

`train(steps)` is one game segment per env with `replay_ratio` updates interleaved per env step
once the store holds `min_replay` rows. Episodes in flight carry over from one call to the next;
`get_state()` holds them (seeds and actions, replayed on restore) with everything else, so a
restored member, on any backend or after a resume, continues exactly as the original would. A
clone inherits its parent's episodes in flight (a copy of each env, rebuilt by replay).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch

from agents.efficientzero import learner
from agents.efficientzero.atari import check_atari_settings, is_atari
from agents.efficientzero.envs import observation_spec, reward_threshold
from agents.efficientzero.mcts import SEARCH_KINDS
from agents.efficientzero.model import build_model
from agents.efficientzero.selfplay import SelfPlay, replay_schema
from evo.agent import AgentContext, Evaluation, TorchAgent
from evo.evolvable import ACTIVATIONS, load_optimizer_state, optimizer_state, remap_optimizer
from evo.hparams import HParam
from evo.records import MutationRecord
from evo.replay import Replay, ReplaySpec, build_replay
from evo.training_thread import prepare_training_thread

__all__ = ["EfficientZeroAgent", "replay_schema"]

TASK_DEFAULTS: dict[str, Any] = {
    "env_id": "CartPole-v1",
    "env_kwargs": {},
    "num_envs": 8,
    "eval_episodes": 10,
    "replay_capacity": 100_000,
    "segment_length": 200,
    "min_replay": 256,
    "priority_alpha": 0.6,
    "priority_beta": 0.4,
    "eval_max_steps": 2000,   # steps per evaluation episode at most (bounds evaluation on long-episode tasks)
    "atari": {},              # ALE/ ids: the Atari 100k protocol's settings (agents.efficientzero.atari)
    # vector observations mapped from the space's finite bounds to [-1, 1] (gymnasium's RescaleObservation;
    # unbounded components pass unchanged): MountainCar's velocity lies within +-0.07, its position in [-1.2, 0.6]
    "rescale_observations": False,
    # the networks' floating-point type; "float64" makes fused and one-by-one training agree to rounding
    "dtype": "float32",
    # torch.compile of the learner's loss and backward: "off" or "on" (learner.compiled_loss; the
    # compiled graphs are cached on disk for every process of the machine; docs/efficientzero.md "Compile")
    "compile": "off",
    # bfloat16 autocast of the learner's forward and backward: "off", "bf16", or "auto" (bf16 for conv
    # members on CPUs with bf16 kernels, else off: learner.effective_autocast; docs/efficientzero.md "bf16")
    "autocast": "off",
}

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class EfficientZeroAgent(TorchAgent):
    kind = "efficientzero"

    # ---- declarations -------------------------------------------------------------------
    @classmethod
    def default_hparams(cls) -> dict[str, HParam]:
        return {
            "lr": HParam(3e-3, min=1e-4, max=1e-2, scale="log"),
            "weight_decay": HParam(1e-4, min=0.0, max=1e-3),
            "num_simulations": HParam(16, min=4, max=50, kind="int"),
            "td_steps": HParam(5, min=1, max=10, kind="int"),
            "discount": HParam(0.997, min=0.95, max=0.999),
            "consistency_weight": HParam(2.0, min=0.0, max=4.0),
            "value_weight": HParam(0.25, min=0.1, max=1.0),
            "policy_weight": HParam(1.0),
            "value_prefix_weight": HParam(1.0),
            # the predicted policies' entropy as a bonus (LightZero's policy_entropy_weight, 5e-3 to 5e-2 in its
            # UniZero configs): keeps a prior from collapsing onto one action when few simulations cannot
            # outvote it; 0 computes nothing (learner.ENTROPY_WEIGHT)
            "policy_entropy_weight": HParam(0.0),
            "collect_temperature": HParam(1.0, min=0.25, max=1.5),
            "batch_size": HParam(128, min=32, max=512, kind="int"),
            "replay_ratio": HParam(0.25, min=0.05, max=1.0),
            "reanalyse_ratio": HParam(0.0, min=0.0, max=1.0),
            "target_update_interval": HParam(100, min=10, max=1000, kind="int"),
            "num_unroll_steps": HParam(5, kind="int"),
            "lstm_horizon_len": HParam(5, kind="int"),
            "grad_clip": HParam(10.0),
            "dirichlet_alpha": HParam(0.3),
            "exploration_fraction": HParam(0.25),
            "eval_simulations": HParam(0, kind="int"),  # 0: use num_simulations
            # the search kind: "puct" (MuZero's) or "gumbel" (Gumbel MuZero); evolvable as
            # search = { value = "gumbel", choices = ["puct", "gumbel"] } (agents.efficientzero.mcts)
            "search": HParam("puct", kind="choice", choices=("puct",)),
            "max_considered_actions": HParam(16, kind="int"),  # Gumbel: root actions considered (top-k)
            # train positions past a terminal as an absorbing state (value 0, no reward; LightZero) instead
            # of masking them out of the value and value-prefix losses (opt-in until measured)
            "absorbing_terminal": HParam(False),
            # temporally-extended exploration when collecting (selfplay.ExtendedExploration, Dabney et al.
            # 2021's ez-greedy): per step, with probability explore_epsilon a random action held for
            # n ~ zeta(explore_duration_mu) steps (at most explore_max_duration); 0 = the search's actions only.
            # Fixed unless a file gives a range (as experiments/cartpole_efficientzero.toml does), so files
            # that do not mention them evolve exactly what they did before
            "explore_epsilon": HParam(0.0),
            "explore_duration_mu": HParam(2.0),
            "explore_max_duration": HParam(100, kind="int"),
            # env i of n explores with explore_epsilon ** (1 + explore_spread * i / (n - 1)) (Ape-X's spectrum)
            "explore_spread": HParam(0.0),
            # annealed as a DQN's: from explore_epsilon_start down to explore_epsilon over the member's first
            # explore_decay_steps env steps (counted across clones, which copy the counters); 0 = no schedule
            "explore_epsilon_start": HParam(1.0),
            "explore_decay_steps": HParam(0, kind="int"),
        }

    @classmethod
    def default_arch(cls) -> dict[str, Any]:
        return {
            "variant": "auto",            # "mlp" | "conv" | "auto" (conv for [C, H, W] observations)
            "latent_size": 64,            # MLP latent width
            "width": 64,                  # hidden width of the MLP trunks
            "blocks": [64],               # residual hidden layers of every MLP trunk
            "lstm_hidden_size": 64,
            "fc_reward_layers": [32],
            "proj_size": 64,
            "value_support": 25,          # bins -S..S on the h-transformed scale
            "reward_support": 5,
            "support_step": 1.0,          # the bins' width on that scale (value and value prefix)
            "activation": "ReLU",
            "channels": 16,               # conv variant
            "num_res_blocks": 1,
            "reward_head_channels": 4,
            "head_channels": 4,
            "downsample": False,
            "norm_type": "LN",
            # mutation bounds
            "min_blocks": 0, "max_blocks": 3, "min_hidden": 16, "max_hidden": 256,
            "min_width": 16, "max_width": 256, "node_step": 16,
            "max_lstm_hidden_size": 256, "min_res_blocks": 0, "max_res_blocks": 4,
        }

    _INTERNAL_ARCH = ("rep_width", "rep_blocks", "dyn_width", "dyn_blocks", "pred_width", "pred_blocks", "dyn_res_blocks")

    @classmethod
    def validate_arch(cls, arch: dict[str, Any]) -> dict[str, Any]:
        defaults = cls.default_arch()
        unknown = sorted(set(arch) - set(defaults) - set(cls._INTERNAL_ARCH))
        if unknown:
            raise ValueError(f"arch.{unknown[0]}: unknown architecture key; expected some of {sorted(defaults)}")
        out = {**defaults, **arch}
        for key in ("latent_size", "width", "lstm_hidden_size", "proj_size", "value_support", "reward_support",
                    "channels", "reward_head_channels", "head_channels"):
            if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
                raise ValueError(f"arch.{key}: expected a positive integer, found {out[key]!r}")
        if isinstance(out["support_step"], bool) or not isinstance(out["support_step"], (int, float)) \
                or not 0 < out["support_step"] < float("inf"):
            raise ValueError(f"arch.support_step: expected a positive number, found {out['support_step']!r}")
        out["support_step"] = float(out["support_step"])
        if out["proj_size"] < 2:
            raise ValueError(f"arch.proj_size: expected at least 2, found {out['proj_size']}")
        for key in ("blocks", "fc_reward_layers"):
            if not isinstance(out[key], (list, tuple)) or not all(isinstance(v, int) and v > 0 for v in out[key]):
                raise ValueError(f"arch.{key}: expected a list of positive integers, found {out[key]!r}")
            out[key] = list(out[key])
        if out["activation"] not in ACTIVATIONS:
            raise ValueError(f"arch.activation: expected one of {sorted(ACTIVATIONS)}, found {out['activation']!r}")
        if out["variant"] not in ("auto", "mlp", "conv"):
            raise ValueError(f"arch.variant: expected 'auto', 'mlp' or 'conv', found {out['variant']!r}")
        if out["norm_type"] not in ("LN", "BN"):
            raise ValueError(f"arch.norm_type: expected 'LN' or 'BN', found {out['norm_type']!r}")
        for part in ("rep", "dyn", "pred"):
            out.setdefault(f"{part}_width", out["width"])
            out.setdefault(f"{part}_blocks", list(out["blocks"]))
        return out

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(task) - set(TASK_DEFAULTS))
        if unknown:
            raise ValueError(f"task.{unknown[0]}: unknown task key; expected some of {sorted(TASK_DEFAULTS)}")
        out = {**TASK_DEFAULTS, **task}
        if not isinstance(out["env_id"], str) or not out["env_id"]:
            raise ValueError(f"task.env_id: expected a gymnasium environment id, found {out['env_id']!r}")
        for key in ("num_envs", "eval_episodes", "replay_capacity", "segment_length", "min_replay", "eval_max_steps"):
            if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
                raise ValueError(f"task.{key}: expected a positive integer, found {out[key]!r}")
        if not isinstance(out["env_kwargs"], dict):
            raise ValueError(f"task.env_kwargs: expected a table, found {out['env_kwargs']!r}")
        if not isinstance(out["rescale_observations"], bool):
            raise ValueError(f"task.rescale_observations: expected true or false, found {out['rescale_observations']!r}")
        if out["compile"] not in learner.COMPILE_MODES:
            raise ValueError(f"task.compile: expected one of {list(learner.COMPILE_MODES)}, found {out['compile']!r}")
        if out["dtype"] not in DTYPES:
            raise ValueError(f"task.dtype: expected one of {sorted(DTYPES)}, found {out['dtype']!r}")
        if out["autocast"] not in learner.AUTOCAST_MODES:
            raise ValueError(f"task.autocast: expected one of {list(learner.AUTOCAST_MODES)}, found {out['autocast']!r}")
        if out["autocast"] == "bf16" and (out["compile"] != "off" or out["dtype"] != "float32"):
            raise ValueError(f"task.autocast: {out['autocast']!r} needs compile = 'off' and dtype = 'float32', "
                             f"found compile = {out['compile']!r}, dtype = {out['dtype']!r}")
        if is_atari(out["env_id"]):
            out["atari"] = check_atari_settings(out["atari"])
        elif out["atari"]:
            raise ValueError(f"task.atari: only for ALE/ environments, found it with {out['env_id']!r}")
        try:
            observation_spec(out)
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"task.env_id: cannot make {out['env_id']!r} ({type(exc).__name__}: {exc})") from None
        return out

    @classmethod
    def reward_threshold(cls, task: dict[str, Any]) -> float | None:
        """gymnasium's threshold for the env (fitness is the mean greedy return, on its scale). Reads the
        registry alone: the experiment's task is already validated, so no env is made again."""
        return reward_threshold(task)

    @classmethod
    def replay_spec(cls, task: dict[str, Any]) -> ReplaySpec:
        """Prioritised sequence replay of every member's self-play, linked by episode."""
        task = cls.validate_task(task)
        spec = observation_spec(task)
        return ReplaySpec(replay_schema(spec.shape, spec.num_actions, spec.dtype), capacity=task["replay_capacity"],
                          sampler="prioritized", alpha=task["priority_alpha"], beta=task["priority_beta"],
                          episode_field="episode")

    # ---- lifecycle ------------------------------------------------------------------------
    def __init__(self, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
                 context: AgentContext) -> None:
        self.index, self.seed, self.context = int(index), int(seed), context
        self.task = self.validate_task(dict(context.task))
        self.arch = self.validate_arch(dict(arch))
        defaults = {k: hp.value for k, hp in self.default_hparams().items()}
        unknown = sorted(set(hparams) - set(defaults))
        if unknown:
            raise ValueError(f"hparams.{unknown[0]}: unknown hyperparameter; expected some of {sorted(defaults)}")
        self.hparams = {**defaults, **hparams}
        if self.hparams["search"] not in SEARCH_KINDS:
            raise ValueError(f"hparams.search: expected one of {list(SEARCH_KINDS)}, found {self.hparams['search']!r}")
        obs_spec = observation_spec(self.task)
        self.obs_shape, self.num_actions = obs_spec.shape, obs_spec.num_actions
        self.init_rng(seed)
        # built on the CPU from the member's generator (the same initial weights on every device), then
        # moved to the device the scheduler gave this member (`AgentContext.device`, e.g. a Ray GPU share)
        self.device = torch.device(context.device)
        self.model = build_model(self.obs_shape, self.num_actions, self.arch, self.generator).to(
            device=self.device, dtype=DTYPES[self.task["dtype"]])
        self.arch.update(self.model.arch())
        self.model.obs_scale = obs_spec.obs_scale  # uint8 images are read as pixel / 255
        self.target_model = copy.deepcopy(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.hparams["lr"],
                                          weight_decay=self.hparams["weight_decay"])
        self.selfplay = SelfPlay(self.task)
        self.last_train_seconds = 0.0
        self.env_steps = 0
        self.updates = 0
        self.update_credit = 0.0
        self._replay_ready = False

    @property
    def replay(self) -> Replay:
        """The run's shared store; a private in-process one is made on first use when the context has
        none (an exported agent trained further outside a run)."""
        if self.context.replay is None:
            self.context.replay = build_replay(self.replay_spec(self.task), self.context.seed, distributed=False)
        return self.context.replay

    @classmethod
    def create(cls, arch: dict[str, Any], hparams: dict[str, Any], seed: int, index: int,
               context: AgentContext) -> EfficientZeroAgent:
        return cls(arch, hparams, seed, index, context)

    @classmethod
    def fused_trainer(cls, compile: bool = False) -> Any:
        """What trains a group of same-architecture members as one program (`resources.fused`;
        agents/efficientzero/fused.py, docs/fused.md)."""
        from agents.efficientzero.fused import FusedEfficientZero

        return FusedEfficientZero(compile=compile)

    def networks(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def set_hparams(self, values: dict[str, Any]) -> None:
        unknown = sorted(set(values) - set(self.hparams))
        if unknown:
            raise ValueError(f"hparams.{unknown[0]}: unknown hyperparameter for efficientzero")
        super().set_hparams(values)

    # ---- training and evaluation ------------------------------------------------------------
    def train(self, steps: int) -> dict[str, float]:
        prepare_training_thread(1)  # as a scheduler does; a member built by hand gets it too
        learned: dict[str, list[float]] = {}
        compiled0 = learner.compile_stats()["compile_seconds"]
        t0 = time.perf_counter()
        finished = self.selfplay.collect(self.model, self.hparams, self.rng, self.replay, self.index, steps,
                                         lambda n: self._learn_after(n, learned), self.env_steps)
        out = {k: float(np.mean(v)) for k, v in learned.items()}
        self.last_train_seconds = time.perf_counter() - t0
        out.update({"env_steps": float(self.env_steps), "updates": float(self.updates),
                    "train_episodes": float(len(finished)), "train_seconds": self.last_train_seconds,
                    "carry_restarts": float(self.selfplay.carry_restarts)})
        if self.task["compile"] != "off":  # seconds of this call spent compiling (or loading) graphs
            out["compile_seconds"] = learner.compile_stats()["compile_seconds"] - compiled0
        if finished:  # episodes carry over between calls, so long ones finish in a later call
            out["train_episode_return"] = float(np.mean(finished))
        return out

    def _learn_after(self, env_steps: int, learned: dict[str, list[float]]) -> None:
        """Earn `replay_ratio` updates per env step; spend them once the store holds `min_replay` rows."""
        self.env_steps += env_steps
        self.update_credit += env_steps * float(self.hparams["replay_ratio"])
        while self.update_credit >= 1.0 and self._ready():
            self.update_credit -= 1.0
            for k, v in self.update().items():
                learned.setdefault(k, []).append(v)
        self.update_credit = min(self.update_credit, 4.0 * env_steps)  # no burst of stale credit before data exists

    def _ready(self) -> bool:
        """Enough rows to learn from? (Remembered once true: len() is a round trip to a Ray store.)"""
        if not self._replay_ready:
            self._replay_ready = len(self.replay) >= max(int(self.task["min_replay"]), 1)
        return self._replay_ready

    def update(self) -> dict[str, float]:
        """One gradient update from the shared replay (see `learner`)."""
        batch = learner.sample_batch(self.replay, self.target_model, self.hparams, self.rng)
        metrics = learner.update(self.model, self.target_model, self.optimizer, self.replay, batch, self.hparams,
                                 step=self.updates + 1, compile=self.task["compile"] == "on",
                                 autocast=self.task["autocast"])
        self.updates += 1
        return metrics

    def evaluate(self) -> Evaluation:
        """`eval_episodes` greedy episodes of at most `eval_max_steps` steps. What evaluating costs is
        reported beside the fitness: `eval_seconds` and `eval_seconds_share`, its share of this
        member's last train + evaluate time."""
        prepare_training_thread(1)
        t0 = time.perf_counter()
        metrics = self.selfplay.evaluate(self.model, self.hparams, self.context.seed)
        seconds = time.perf_counter() - t0
        metrics.update({"env_steps": float(self.env_steps), "updates": float(self.updates), "eval_seconds": seconds,
                        "eval_seconds_share": seconds / max(seconds + self.last_train_seconds, 1e-9)})
        return Evaluation(fitness=metrics["eval_return"], metrics=metrics)

    # ---- evolution ------------------------------------------------------------------------
    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        record, change = self.model.mutate_architecture(rng, new_layer_prob, self.arch, self.generator)
        if record.op != "none":
            remap_optimizer(self.optimizer, change)
            self.arch.update(self.model.arch())
            self.target_model = copy.deepcopy(self.model)
        return record

    def set_activation(self, name: str) -> MutationRecord:
        old = self.arch["activation"]
        change = self.model.set_activation(name)
        remap_optimizer(self.optimizer, change)
        self.arch["activation"] = name
        self.target_model = copy.deepcopy(self.model)
        return MutationRecord("set_activation", function_preserving=old == name)

    # ---- state ----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "seed": self.seed,
            "arch": copy.deepcopy(self.arch),
            "hparams": dict(self.hparams),
            "task": copy.deepcopy(self.task),
            # CPU copies wherever the member trains, like the optimizer's state: the tree checkpoints anywhere
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "target_model": {k: v.detach().to("cpu", copy=True) for k, v in self.target_model.state_dict().items()},
            "optimizer": optimizer_state(self.optimizer, self.model),
            "rng": self.rng_state(),
            "selfplay": self.selfplay.state(),  # the episodes in flight
            "counters": {"env_steps": self.env_steps, "updates": self.updates, "episodes": self.selfplay.episodes,
                         "update_credit": self.update_credit},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], context: AgentContext) -> EfficientZeroAgent:
        if state.get("kind", cls.kind) != cls.kind:
            raise ValueError(f"state.kind: expected {cls.kind!r}, found {state.get('kind')!r}")
        if not context.task:
            context = AgentContext(task=dict(state["task"]), replay=context.replay, device=context.device,
                                   seed=context.seed)
        agent = cls(state["arch"], state["hparams"], int(state["seed"]), int(state["index"]), context)
        agent.model.load_state_dict(state["model"])
        agent.target_model.load_state_dict(state["target_model"])
        load_optimizer_state(agent.optimizer, agent.model, state["optimizer"])
        agent.restore_rng(state["rng"])
        c = state["counters"]
        agent.env_steps, agent.updates = int(c["env_steps"]), int(c["updates"])
        agent.selfplay.episodes = int(c["episodes"])
        agent.selfplay.load_state(state.get("selfplay"))
        agent.update_credit = float(c["update_credit"])
        return agent
