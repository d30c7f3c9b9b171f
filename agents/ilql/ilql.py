"""`ILQL`: the learner, with AgileRL's documented constructor and methods.

    ILQL(dataset, net_config, index=0, batch_size=64, lr=1e-5, alpha=0.005, beta=0.0, gamma=0.99,
         tau=0.6, transition_weight=0.0, clip_weight=None, value_max=None,
         value_min=None, detach_v=False, detach_q=False, detach_pi=False, double_q=True,
         per_token=True, exp_weights=True, dm_margin=0.0, cql_temp=1.0, weight_decay=0.0,
         device='cpu')

`alpha` is the Polyak rate of the target Q heads, `beta` the AWAC temperature used in training,
`tau` the expectile of the V loss. Unlike AgileRL's, both Q heads and both target heads are saved
under their own names, targets are read from the same hidden state as the online heads, and
there is no `mutation` argument (evo's engine mutates members from outside).

`dataset` is a dict of numpy arrays (see `agents.ilql.data`), the shared replay store together
with a `sample_fn(n, rng)` that draws rows from it (set by `ILQLAgent`), or None for inference only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.ilql.data import FIELDS, to_torch, validate_dataset
from agents.ilql.losses import ILQLLossConfig, ilql_loss
from agents.ilql.model import ILQLModel
from evo.checkpoint import load_state, save_state
from evo.evolvable import load_optimizer_state, optimizer_state
from evo.rng import new_streams, restore_streams, streams_state

__all__ = ["ILQL"]

class ILQL:
    def __init__(self, dataset: Any, net_config: dict[str, Any], index: int = 0, batch_size: int = 64,
                 lr: float = 1e-5, alpha: float = 0.005, beta: float = 0.0, gamma: float = 0.99, tau: float = 0.6,
                 transition_weight: float = 0.0, clip_weight: float | None = None,
                 value_max: float | None = None, value_min: float | None = None, detach_v: bool = False,
                 detach_q: bool = False, detach_pi: bool = False, double_q: bool = True, per_token: bool = True,
                 exp_weights: bool = True, dm_margin: float = 0.0, cql_temp: float = 1.0,
                 weight_decay: float = 0.0, device: str = "cpu", *, seed: int = 0,
                 v_weight: float = 1.0, cql_weight: float = 0.01, awac_weight: float = 1.0,
                 dm_weight: float = 0.0, grad_clip: float | None = 1.0, gpt_config: dict[str, Any] | None = None) -> None:
        if not per_token:
            raise ValueError("per_token: expected True (this ILQL is the per-token MDP of Snell et al.), found False")
        self.algo = "ILQL"
        self.index = index
        self.dataset = dataset
        if isinstance(dataset, dict):
            validate_dataset(dataset, net_config.get("vocab_size"))
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.alpha = float(alpha)
        self.detach_v, self.detach_q, self.detach_pi = detach_v, detach_q, detach_pi
        self.double_q = double_q
        self.grad_clip = grad_clip
        self.loss_cfg = ILQLLossConfig(
            gamma=gamma, tau=tau, beta=beta, cql_temp=cql_temp, exp_weights=exp_weights, clip_weight=clip_weight,
            transition_weight=transition_weight, value_min=value_min, value_max=value_max, dm_margin=dm_margin,
            v_weight=v_weight, cql_weight=cql_weight, awac_weight=awac_weight, dm_weight=dm_weight)
        self.generator, self.rng = new_streams(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.model = ILQLModel(net_config, double_q=double_q, gpt_config=gpt_config)
        self.model.to(self.device)
        self.optimizer = self._make_optimizer()
        self.sample_fn: Any = None  # optional (n, rng) -> batch; set by ILQLAgent for keyed store draws
        self.steps = 0

    # ---- hyperparameters ------------------------------------------------------------------------
    @property
    def net_config(self) -> dict[str, Any]:
        return self.model.net_config

    @property
    def gamma(self) -> float:
        return self.loss_cfg.gamma

    @property
    def tau(self) -> float:
        return self.loss_cfg.tau

    @property
    def beta(self) -> float:
        return self.loss_cfg.beta

    def _make_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.trainable_parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def init_dict(self) -> dict[str, Any]:
        """The constructor arguments (besides dataset and net_config), JSON-able."""
        c = self.loss_cfg
        return {
            "index": self.index, "batch_size": self.batch_size, "lr": self.lr, "alpha": self.alpha, "beta": c.beta,
            "gamma": c.gamma, "tau": c.tau, "transition_weight": c.transition_weight, "clip_weight": c.clip_weight,
            "value_max": c.value_max, "value_min": c.value_min, "detach_v": self.detach_v, "detach_q": self.detach_q,
            "detach_pi": self.detach_pi, "double_q": self.double_q, "per_token": True, "exp_weights": c.exp_weights,
            "dm_margin": c.dm_margin, "cql_temp": c.cql_temp, "weight_decay": self.weight_decay,
            "v_weight": c.v_weight, "cql_weight": c.cql_weight, "awac_weight": c.awac_weight,
            "dm_weight": c.dm_weight, "grad_clip": self.grad_clip,
        }

    # ---- model ----------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, state_idxs: torch.Tensor, action_idxs: torch.Tensor,
                attn_mask: torch.Tensor | None = None, detach_v: bool | None = None, detach_q: bool | None = None,
                detach_pi: bool | None = None) -> dict[str, Any]:
        """logits (B, L, V), qs / target_qs: lists of (B, A, V), vs (B, S)."""
        return self.model(tokens, state_idxs, action_idxs, attn_mask,
                          detach_v=self.detach_v if detach_v is None else detach_v,
                          detach_q=self.detach_q if detach_q is None else detach_q,
                          detach_pi=self.detach_pi if detach_pi is None else detach_pi)

    __call__ = forward

    def soft_update(self) -> None:
        """Polyak-average both target Q heads towards the online heads at rate `alpha`."""
        self.model.soft_update(self.alpha)

    def hard_update(self) -> None:
        self.model.hard_update()

    # ---- training -------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None) -> dict[str, torch.Tensor]:
        n = batch_size or self.batch_size
        if self.dataset is None:
            raise RuntimeError("ILQL.sample: this agent has no dataset (it was loaded for inference)")
        if self.sample_fn is not None:
            data = self.sample_fn(n, self.rng)
        elif isinstance(self.dataset, dict):
            rows = self.rng.integers(len(self.dataset["tokens"]), size=n)
            data = {k: np.asarray(self.dataset[k])[rows] for k in FIELDS}
        else:
            raise RuntimeError("ILQL.sample: a replay-store dataset needs a sample_fn (ILQLAgent sets one)")
        return _trim(to_torch(data, self.device))

    def learn(self, batch: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """One gradient step on a batch (sampled if not given), then a Polyak target update."""
        batch = batch if batch is not None else self.sample()
        self.model.train()
        with self._dropout_stream():
            out = self.forward(batch["tokens"], batch["state_idxs"], batch["action_idxs"], batch["attn_mask"])
        loss, metrics = ilql_loss(out, batch, self.loss_cfg)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip:
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), self.grad_clip))
        self.optimizer.step()
        self.soft_update()
        self.steps += 1
        return metrics

    def reseed(self, seed: int) -> None:
        """New random streams (training-row draws and any torch sampling) from `seed`; weights untouched."""
        self.generator, self.rng = new_streams(seed)

    @contextmanager
    def _dropout_stream(self) -> Iterator[None]:
        """Dropout draws from torch's global stream, which members of one process share and no
        checkpoint holds: for the forward pass, seed it from this learner's own generator instead."""
        if not float(self.net_config.get("dropout", 0.0)):
            yield
            return
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(int(torch.randint(2**62, (1,), generator=self.generator)))
            yield

    # ---- copies and checkpoints ------------------------------------------------------------------
    def clone(self, index: int | None = None, seed: int | None = None) -> ILQL:
        """A copy with the same weights, optimizer and counters; `seed` gives it streams of its own."""
        twin = ILQL.from_state(self.get_state(), self.dataset, device=str(self.device))
        twin.index = self.index if index is None else index
        if seed is not None:
            twin.reseed(seed)
        return twin

    def get_state(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "net_config": json.dumps(self.net_config),
            "init": json.dumps(self.init_dict()),
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": optimizer_state(self.optimizer, self.model),
            "rng": streams_state(self.generator, self.rng),
            "steps": self.steps,
            # a pretrained backbone's GPT-2 config rebuilds its shape without the checkpoint directory
            **({"gpt_config": json.dumps(self.model.gpt_config())} if self.net_config.get("pretrained") else {}),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], dataset: Any = None, device: str = "cpu") -> ILQL:
        init = json.loads(state["init"])
        agent = cls(dataset, json.loads(state["net_config"]), device=device, gpt_config=_gpt_config(state), **init)
        agent.set_state(state)
        return agent

    def set_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict({k: torch.as_tensor(v) for k, v in state["model"].items()}, strict=True)
        self.optimizer = self._make_optimizer()
        load_optimizer_state(self.optimizer, self.model, state["optimizer"])
        self.generator, self.rng = restore_streams(state["rng"])
        self.steps = int(state["steps"])

    def save_checkpoint(self, path: str | Path) -> None:
        """safetensors + JSON (a directory), never pickle."""
        save_state(path, self.get_state())

    def load_checkpoint(self, path: str | Path) -> None:
        state, _ = load_state(path)
        net_config = json.loads(state["net_config"])
        if net_config != self.net_config:  # the checkpoint's architecture wins
            with torch.random.fork_rng(devices=[]):
                self.model = ILQLModel(net_config, double_q=json.loads(state["init"])["double_q"],
                                       gpt_config=_gpt_config(state)).to(self.device)
        for key, value in json.loads(state["init"]).items():
            if key in ("lr", "weight_decay", "alpha", "batch_size", "index", "grad_clip"):
                setattr(self, key, value)
        self.set_state(state)


def _gpt_config(state: dict[str, Any]) -> dict[str, Any] | None:
    return json.loads(state["gpt_config"]) if "gpt_config" in state else None


def _trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop padding columns that no row of this batch uses (right padding only; indices stay valid)."""
    used = int(batch["attn_mask"].any(0).nonzero().max()) + 1 if batch["attn_mask"].any() else 1
    if used < batch["tokens"].shape[1]:
        batch = {**batch, "tokens": batch["tokens"][:, :used], "attn_mask": batch["attn_mask"][:, :used]}
    return batch
