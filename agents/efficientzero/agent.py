"""EfficientZero as an evo population member.

One `train(steps)` call is one game segment per vector env: the envs are reset from the
member's own RNG, `steps` environment steps are collected with batched MCTS over all envs at
once, finished episodes (and every `segment_length` rows of long ones) go to the run's shared
replay store, and gradient updates are interleaved at `replay_ratio` updates per env step.
Because segments start from fresh resets drawn from the member's RNG, `get_state()` between
calls captures everything: a restored member continues exactly as the original would.

An update samples prioritised sequence windows of K + 1 + td_steps rows, recomputes n-step value
targets with the target network (reanalyse; optionally re-searches a fraction of the policy
targets), unrolls the model K steps and minimises

    loss = w_p * loss_policy + w_v * loss_value + w_vp * loss_value_prefix + w_c * loss_consistency
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from agents.efficientzero.envs import env_spaces, make_vector_env
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, select_actions
from agents.efficientzero.model import build_model, set_model_activation
from agents.efficientzero.support import scalar_to_support, support_to_scalar
from agents.efficientzero.targets import nstep_value_targets, value_prefix_targets
from evo.agent import AgentContext, Evaluation, TorchAgent
from evo.evolvable import ACTIVATIONS, EvolvableMLP, ParamChange, load_optimizer_state, optimizer_state, remap_optimizer
from evo.hparams import HParam
from evo.records import MutationRecord
from evo.replay import Field, Replay, ReplaySpec, Schema, build_replay

__all__ = ["EfficientZeroAgent", "replay_schema"]

EPISODE_SHIFT = 40

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
}


def replay_schema(obs_shape: tuple[int, ...], num_actions: int):
    """The rows EfficientZero self-play writes to the shared store."""
    return Schema({
        "obs": Field("float32", tuple(obs_shape)),
        "action": Field("int64"),
        "reward": Field("float32"),
        "terminal": Field("bool"),
        "policy": Field("float32", (num_actions,)),
        "root_value": Field("float32"),
        "episode": Field("int64"),
        "step": Field("int64"),
    })


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
        for key in ("num_envs", "eval_episodes", "replay_capacity", "segment_length", "min_replay"):
            if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
                raise ValueError(f"task.{key}: expected a positive integer, found {out[key]!r}")
        if not isinstance(out["env_kwargs"], dict):
            raise ValueError(f"task.env_kwargs: expected a table, found {out['env_kwargs']!r}")
        try:
            env_spaces(out["env_id"], out["env_kwargs"])
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"task.env_id: cannot make {out['env_id']!r} ({type(exc).__name__}: {exc})") from None
        return out

    @classmethod
    def replay_spec(cls, task: dict[str, Any]) -> ReplaySpec:
        """Prioritised sequence replay of every member's self-play, linked by episode."""
        task = cls.validate_task(task)
        obs_shape, num_actions = env_spaces(task["env_id"], task["env_kwargs"])
        return ReplaySpec(replay_schema(obs_shape, num_actions), capacity=task["replay_capacity"],
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
        self.obs_shape, self.num_actions = env_spaces(self.task["env_id"], self.task["env_kwargs"])
        self.init_rng(seed)
        self.model = build_model(self.obs_shape, self.num_actions, self.arch, self.generator)
        self.arch.update(self.model.arch())
        self.target_model = copy.deepcopy(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.hparams["lr"],
                                          weight_decay=self.hparams["weight_decay"])
        self.env_steps = 0
        self.updates = 0
        self.episodes = 0
        self.update_credit = 0.0
        self._envs = None
        self._eval_envs = None

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

    def networks(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def set_hparams(self, values: dict[str, Any]) -> None:
        unknown = sorted(set(values) - set(self.hparams))
        if unknown:
            raise ValueError(f"hparams.{unknown[0]}: unknown hyperparameter for efficientzero")
        super().set_hparams(values)

    def _mcts(self, simulations: int | None = None) -> BatchedMCTS:
        hp = self.hparams
        return BatchedMCTS(MCTSConfig(num_simulations=int(simulations or hp["num_simulations"]),
                                      discount=float(hp["discount"]), lstm_horizon_len=int(hp["lstm_horizon_len"]),
                                      dirichlet_alpha=float(hp["dirichlet_alpha"]),
                                      exploration_fraction=float(hp["exploration_fraction"])))

    # ---- self-play ------------------------------------------------------------------------
    def _new_episode_id(self) -> int:
        self.episodes += 1
        return (self.index << EPISODE_SHIFT) | self.episodes

    def train(self, steps: int) -> dict[str, float]:
        torch.set_num_threads(1)
        n = int(self.task["num_envs"])
        if self._envs is None:
            self._envs = make_vector_env(self.task["env_id"], n, self.task["env_kwargs"])
        envs = self._envs
        obs, _ = envs.reset(seed=int(self.rng.integers(2**31)))
        buffers = [self._empty_rows() for _ in range(n)]
        ep_ids = [self._new_episode_id() for _ in range(n)]
        ep_steps = [0] * n
        returns = np.zeros(n)
        finished: list[float] = []
        metrics_acc: dict[str, list[float]] = {}
        mcts = self._mcts()
        t0 = time.perf_counter()
        collected = 0
        self.model.eval()
        while collected < steps:
            result = mcts.run(self.model, torch.as_tensor(obs, dtype=torch.float32), self.rng, add_noise=True)
            actions = select_actions(result.visit_counts, float(self.hparams["collect_temperature"]), self.rng)
            next_obs, reward, term, trunc, _ = envs.step(actions)
            for i in range(n):
                rows = buffers[i]
                rows["obs"].append(np.asarray(obs[i], dtype=np.float32))
                rows["action"].append(int(actions[i]))
                rows["reward"].append(float(reward[i]))
                rows["terminal"].append(bool(term[i]))
                rows["policy"].append(result.policy[i].astype(np.float32))
                rows["root_value"].append(float(result.root_values[i]))
                rows["step"].append(ep_steps[i])
                ep_steps[i] += 1
                returns[i] += reward[i]
                if term[i] or trunc[i]:
                    finished.append(float(returns[i]))
                    returns[i] = 0.0
                    self._flush(rows, ep_ids[i])
                    buffers[i] = self._empty_rows()
                    ep_ids[i], ep_steps[i] = self._new_episode_id(), 0
                elif len(rows["obs"]) >= self.task["segment_length"]:
                    self._flush(rows, ep_ids[i])
                    buffers[i] = self._empty_rows()
                    ep_ids[i] = self._new_episode_id()
            obs = next_obs
            collected += n
            self.env_steps += n
            self.update_credit += n * float(self.hparams["replay_ratio"])
            while self.update_credit >= 1.0 and self._replay_ready():
                self.update_credit -= 1.0
                for k, v in self.update().items():
                    metrics_acc.setdefault(k, []).append(v)
            self.update_credit = min(self.update_credit, 4.0 * n)  # no burst of stale credit before data exists
        for i in range(n):
            if buffers[i]["obs"]:
                self._flush(buffers[i], ep_ids[i])
        self.model.eval()
        out = {k: float(np.mean(v)) for k, v in metrics_acc.items()}
        out.update({"env_steps": float(self.env_steps), "updates": float(self.updates),
                    "train_episodes": float(len(finished)), "train_seconds": time.perf_counter() - t0})
        if finished:  # none finish when every episode outlives steps / num_envs
            out["train_episode_return"] = float(np.mean(finished))
        return out

    def _replay_ready(self) -> bool:
        """Enough rows to learn from? (Remembered once true: len() is a round trip to a Ray store.)"""
        if not getattr(self, "_ready", False):
            self._ready = len(self.replay) >= max(int(self.task["min_replay"]), 1)
        return self._ready

    @staticmethod
    def _empty_rows() -> dict[str, list]:
        return {k: [] for k in ("obs", "action", "reward", "terminal", "policy", "root_value", "step")}

    def _flush(self, rows: dict[str, list], episode: int) -> None:
        if not rows["obs"]:
            return
        batch = {
            "obs": np.stack(rows["obs"]).astype(np.float32),
            "action": np.asarray(rows["action"], dtype=np.int64),
            "reward": np.asarray(rows["reward"], dtype=np.float32),
            "terminal": np.asarray(rows["terminal"], dtype=bool),
            "policy": np.stack(rows["policy"]).astype(np.float32),
            "root_value": np.asarray(rows["root_value"], dtype=np.float32),
            "episode": np.full(len(rows["obs"]), episode, dtype=np.int64),
            "step": np.asarray(rows["step"], dtype=np.int64),
        }
        self.replay.insert(batch)

    # ---- learning -------------------------------------------------------------------------
    def update(self) -> dict[str, float]:
        hp = self.hparams
        K, n_td, H = int(hp["num_unroll_steps"]), int(hp["td_steps"]), int(hp["lstm_horizon_len"])
        B = int(hp["batch_size"])
        L = K + 1 + n_td
        seq = self.replay.sample_sequences(B, L)
        data, mask = seq.data, np.asarray(seq.mask, dtype=bool)
        obs = torch.as_tensor(np.asarray(data["obs"]), dtype=torch.float32)
        B = obs.shape[0]
        model, target = self.model, self.target_model
        model.train()

        with torch.no_grad():
            flat = obs.reshape(B * L, *obs.shape[2:])
            _, tv_logits = target.predict(target.represent(flat))
            boot = support_to_scalar(tv_logits, target.value_support).reshape(B, L).numpy()
        rewards = np.asarray(data["reward"], dtype=np.float64)
        terminals = np.asarray(data["terminal"], dtype=bool)
        z, valid = nstep_value_targets(rewards, terminals, mask, boot, float(hp["discount"]), n_td, K + 1)
        vp = value_prefix_targets(rewards, mask, H, K)
        policy_t = np.asarray(data["policy"], dtype=np.float32)[:, : K + 1].copy()
        if float(hp["reanalyse_ratio"]) > 0:
            policy_t = self._reanalyse_policy(obs[:, : K + 1], policy_t, valid)

        actions = torch.as_tensor(np.asarray(data["action"]), dtype=torch.long)[:, :K]
        z_t = torch.as_tensor(z, dtype=torch.float32)
        vp_t = torch.as_tensor(vp, dtype=torch.float32)
        pi_t = torch.as_tensor(policy_t)
        valid_t = torch.as_tensor(valid, dtype=torch.float32)
        mask_t = torch.as_tensor(mask[:, :K], dtype=torch.float32)
        weights = torch.as_tensor(np.asarray(seq.weights), dtype=torch.float32)
        # the store normalises by the smallest priority ever stored, which can make every weight tiny;
        # normalising by the batch's largest weight (as LightZero does) keeps the step size meaningful
        weights = weights / weights.max().clamp_min(1e-12)
        value_target = scalar_to_support(z_t, model.value_support)       # [B, K+1, bins]
        prefix_target = scalar_to_support(vp_t, model.reward_support)    # [B, K, bins]

        with torch.no_grad():  # consistency targets: projections of the real next observations
            nxt = obs[:, 1 : K + 1].reshape(B * K, *obs.shape[2:])
            proj_target = model.project(model.represent(nxt)).reshape(B, K, -1)

        latent = model.represent(obs[:, 0])
        policy_logits, value_logits = model.predict(latent)
        root_value = support_to_scalar(value_logits.detach(), model.value_support)
        loss_value = -(value_target[:, 0] * F.log_softmax(value_logits, -1)).sum(-1) * valid_t[:, 0]
        loss_policy = -(pi_t[:, 0] * F.log_softmax(policy_logits, -1)).sum(-1) * valid_t[:, 0]
        loss_prefix = torch.zeros(B)
        loss_consistency = torch.zeros(B)
        hidden = model.initial_hidden(B)
        for k in range(1, K + 1):
            latent, hidden, prefix_logits = model.dynamics(latent, actions[:, k - 1], hidden)
            if latent.requires_grad:
                latent.register_hook(lambda g: g * 0.5)  # MuZero: halve the gradient through the dynamics
            policy_logits, value_logits = model.predict(latent)
            loss_prefix = loss_prefix - (prefix_target[:, k - 1] * F.log_softmax(prefix_logits, -1)).sum(-1) * mask_t[:, k - 1]
            loss_value = loss_value - (value_target[:, k] * F.log_softmax(value_logits, -1)).sum(-1) * valid_t[:, k]
            loss_policy = loss_policy - (pi_t[:, k] * F.log_softmax(policy_logits, -1)).sum(-1) * valid_t[:, k]
            pred = model.project_predict(model.project(latent))
            cos = F.cosine_similarity(pred, proj_target[:, k - 1], dim=-1)
            loss_consistency = loss_consistency - cos * valid_t[:, k]
            if k % H == 0:
                hidden = model.initial_hidden(B)

        losses = {
            "loss_value": (weights * loss_value).mean(),
            "loss_policy": (weights * loss_policy).mean(),
            "loss_value_prefix": (weights * loss_prefix).mean(),
            "loss_consistency": (weights * loss_consistency).mean(),
        }
        total = (float(hp["value_weight"]) * losses["loss_value"] + float(hp["policy_weight"]) * losses["loss_policy"]
                 + float(hp["value_prefix_weight"]) * losses["loss_value_prefix"]
                 + float(hp["consistency_weight"]) * losses["loss_consistency"])
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(hp["grad_clip"]))
        self.optimizer.step()
        model.eval()
        self.updates += 1
        if self.updates % int(hp["target_update_interval"]) == 0:
            self.target_model.load_state_dict(model.state_dict())

        priorities = np.abs(root_value.numpy() - z[:, 0]) + 1e-6
        self.replay.update_priorities(np.asarray(seq.keys), priorities)
        out = {k: float(v.detach()) for k, v in losses.items()}
        out.update({"loss_total": float(total.detach()), "grad_norm": float(grad_norm),
                    "target_value_mean": float(z[:, 0].mean())})
        return out

    def _reanalyse_policy(self, obs: torch.Tensor, policy: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Re-search a `reanalyse_ratio` share of the batch with the target model (fresher policy targets)."""
        B, P = policy.shape[:2]
        count = int(round(float(self.hparams["reanalyse_ratio"]) * B))
        if count == 0:
            return policy
        rows = np.sort(self.rng.choice(B, size=count, replace=False))
        sub = obs[torch.as_tensor(rows)].reshape(count * P, *obs.shape[2:])
        result = self._mcts().run(self.target_model, sub, self.rng, add_noise=False)
        fresh = result.policy.reshape(count, P, -1).astype(np.float32)
        keep = valid[rows][..., None]
        policy[rows] = np.where(keep, fresh, policy[rows])
        return policy

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self) -> Evaluation:
        torch.set_num_threads(1)
        n = int(self.task["eval_episodes"])
        if self._eval_envs is None:
            self._eval_envs = make_vector_env(self.task["env_id"], n, self.task["env_kwargs"])
        envs = self._eval_envs
        # the same evaluation seeds for every member of a run: fitness is comparable
        obs, _ = envs.reset(seed=int(self.context.seed) * 7919 + 12345)
        returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        done = np.zeros(n, dtype=bool)
        sims = int(self.hparams["eval_simulations"]) or int(self.hparams["num_simulations"])
        mcts = self._mcts(sims)
        self.model.eval()
        while not done.all():
            result = mcts.run(self.model, torch.as_tensor(obs, dtype=torch.float32), None, add_noise=False)
            actions = select_actions(result.visit_counts, 0.0, None)
            obs, reward, term, trunc, _ = envs.step(actions)
            live = ~done
            returns[live] += reward[live]
            lengths[live] += 1
            done |= term | trunc
        return Evaluation(fitness=float(returns.mean()),
                          metrics={"eval_return": float(returns.mean()), "eval_return_std": float(returns.std()),
                                   "eval_length": float(lengths.mean()), "env_steps": float(self.env_steps),
                                   "updates": float(self.updates)})

    # ---- evolution ------------------------------------------------------------------------
    def _bounds(self) -> dict[str, int]:
        keys = ("min_blocks", "max_blocks", "min_hidden", "max_hidden", "min_width", "max_width", "node_step")
        return {k: int(self.arch[k]) for k in keys}

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float) -> MutationRecord:
        if hasattr(self.model, "representation"):
            record, change = self._mutate_mlp(rng, new_layer_prob)
        else:
            record, change = self._mutate_conv(rng, new_layer_prob)
        if record.op != "none":
            remap_optimizer(self.optimizer, change)
            self.arch.update(self.model.arch())
            self.target_model = copy.deepcopy(self.model)
        return record

    def _mutate_mlp(self, rng: np.random.Generator, new_layer_prob: float) -> tuple[MutationRecord, ParamChange]:
        parts = {"representation": self.model.representation, "dynamics": self.model.dynamics_network.trunk,
                 "prediction": self.model.prediction}
        choice = int(rng.integers(len(parts) + 1))
        step = int(self.arch["node_step"])
        if choice == len(parts):
            H = self.model.lstm_hidden_size
            if H + step > int(self.arch["max_lstm_hidden_size"]):
                return MutationRecord.none("lstm_hidden_size at its bound"), ParamChange()
            change = self.model.dynamics_network.widen_lstm(step, self.generator)
            self.model.lstm_hidden_size = H + step
            self.target_model.lstm_hidden_size = H + step
            return MutationRecord("widen_lstm", {"lstm_hidden_size": [H, H + step]}, True, {"network": "dynamics"}), change
        name = list(parts)[choice]
        mlp: EvolvableMLP = parts[name]
        # the trunk output of representation/dynamics is the latent: its width is the latent size
        bounds = self._bounds()
        change, record = mlp.mutate(rng, new_layer_prob, bounds, self.generator)
        record.details["network"] = name
        return record, change

    def _mutate_conv(self, rng: np.random.Generator, new_layer_prob: float) -> tuple[MutationRecord, ParamChange]:
        where = "representation" if rng.random() < 0.5 else "dynamics"
        blocks = self.model.rep_blocks if where == "representation" else self.model.dynamics_network.resblocks
        n = len(blocks)
        lo, hi = int(self.arch["min_res_blocks"]), int(self.arch["max_res_blocks"])
        grow = n < hi and (n <= lo or rng.random() < 2 / 3)
        if grow:
            return (MutationRecord("add_res_block", {"res_blocks": [n, n + 1]}, True, {"network": where}),
                    self.model.add_res_block(where))
        if n > lo:
            return (MutationRecord("remove_res_block", {"res_blocks": [n, n - 1]}, False, {"network": where}),
                    self.model.remove_res_block(where))
        return MutationRecord.none("residual block count at its bounds"), ParamChange()

    def set_activation(self, name: str) -> MutationRecord:
        old = self.arch["activation"]
        change = set_model_activation(self.model, name)
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
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "target_model": {k: v.detach().clone() for k, v in self.target_model.state_dict().items()},
            "optimizer": optimizer_state(self.optimizer, self.model),
            "rng": self.rng_state(),
            "counters": {"env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
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
        agent.env_steps, agent.updates, agent.episodes = int(c["env_steps"]), int(c["updates"]), int(c["episodes"])
        agent.update_credit = float(c["update_credit"])
        return agent
