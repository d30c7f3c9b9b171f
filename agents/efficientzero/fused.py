"""Fused EfficientZero: same-architecture members trained and evaluated in lock-step as one program.

`FusedEfficientZero.train(agents, steps)` does for a group what each member's `train(steps)` does
alone, in the same order for every member, but with the compute fused:

* **self-play**: every member's `SelfPlay.segment` is stepped together; the MCTS of all members'
  roots is one `mcts.search` whose network calls are one vmapped call over the members' stacked
  weights (each root keeps its member's discount, simulation budget and Dirichlet noise, drawn
  from that member's own RNG);
* **learning**: after each vector step every member earns `replay_ratio` updates as alone; in each
  round the members holding a credit sample their own batch from their own replay view (their
  own RNG), and one `evo.fused.FusedGroup.step` takes all their gradient steps (per-member Adam,
  lr, weight decay, clipping and loss weights); the others' slots are masked;
* **evaluation**: the members' evaluation episodes are searched together the same way.

Members' data never mix: each still reads and writes the replay through its own view. So in
float64 (`task.dtype`) a fused group gives each member the results it gets alone, to rounding.
Members with BatchNorm cannot be fused (running statistics under vmap): `group_key` returns None
and the caller trains them one by one.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.func import vmap
from torch.utils._pytree import tree_map

from agents.efficientzero import learner
from agents.efficientzero.mcts import SearchResult, search
from agents.efficientzero.support import support_to_scalar
from evo.agent import Evaluation
from evo.evolvable import load_optimizer_state, optimizer_state
from evo.faults import Diverged
from evo.fused import FusedGroup, StackedModules, architecture_key, batchnorm_modules, call_method, stack_batches
from evo.training_thread import prepare_training_thread

__all__ = ["FusedEfficientZero", "StackedSearchModel", "search_members"]


class StackedSearchModel:
    """The search-model interface (represent / predict / dynamics / initial_hidden) over M members'
    stacked weights. Inputs and outputs are member-major rows: rows [m*n, (m+1)*n) are member m's."""

    def __init__(self, template: torch.nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                 members: int) -> None:
        self.template, self.params, self.buffers, self.members = template, params, buffers, members
        self.action_space_size = template.action_space_size
        self.value_support, self.reward_support = template.value_support, template.reward_support
        self.support_step = template.support_step
        self.device = next(iter(params.values())).device  # where search sends its observations

    def _call(self, method: Any, *args: Any) -> Any:
        M = self.members
        split = tree_map(lambda t: t.reshape(M, t.shape[0] // M, *t.shape[1:]), args)
        one = lambda p, b, *a: call_method(self.template, p, b, method, *a)
        out = vmap(one)(self.params, self.buffers, *split)
        return tree_map(lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]), out)

    def represent(self, obs: torch.Tensor) -> torch.Tensor:
        return self._call("represent", obs)

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call("predict", latent)

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> Any:
        return self._call("dynamics", latent, action, hidden)

    def initial_hidden(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.template.initial_hidden(batch)

    def initial_inference(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """represent + predict in one vmapped call: (latent, policy_logits, value_logits)."""
        return self._call(_initial, obs)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
                            ) -> tuple[Any, ...]:
        """dynamics + predict in one vmapped call: (latent, (h, c), value_prefix, policy, value) logits."""
        return self._call(_recurrent, latent, action, hidden)


def _initial(model: torch.nn.Module, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    latent = model.represent(obs)
    return (latent, *model.predict(latent))


def _recurrent(model: torch.nn.Module, latent: torch.Tensor, action: torch.Tensor,
               hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, ...]:
    latent, hidden, prefix = model.dynamics(latent, action, hidden)
    return (latent, hidden, prefix, *model.predict(latent))


def search_members(model: StackedSearchModel, obs: Sequence[np.ndarray], hps: Sequence[dict[str, Any]],
                   rngs: Sequence[np.random.Generator] | None, evaluation: bool = False) -> list[SearchResult]:
    """One search over every member's roots (obs[m]: member m's [n, ...] observations, equal n),
    each root with its member's discount, simulations, search kind (`search`: PUCT or Gumbel) and
    (with `rngs`) root noise drawn from its member's generator — Dirichlet for a PUCT member, Gumbel
    for a Gumbel one, as its own `BatchedMCTS.run` draws it — in member order; returns each member's
    own `SearchResult`."""
    n = len(obs[0])
    sims = [int(hp["eval_simulations"]) or int(hp["num_simulations"]) if evaluation else int(hp["num_simulations"])
            for hp in hps]
    gumbel = [str(hp.get("search", "puct")) == "gumbel" for hp in hps]
    noise = gumbel_noise = None
    if rngs is not None:
        noise = lambda A: np.concatenate([np.zeros((n, A)) if g else rng.dirichlet([float(hp["dirichlet_alpha"])] * A, size=n)
                                          for rng, hp, g in zip(rngs, hps, gumbel)])
        gumbel_noise = lambda A: np.concatenate([rng.gumbel(size=(n, A)) if g else np.zeros((n, A))
                                                 for rng, g in zip(rngs, gumbel)])
    horizon = {int(hp["lstm_horizon_len"]) for hp in hps}
    if len(horizon) != 1:
        raise ValueError(f"search_members: members of one group share lstm_horizon_len, found {sorted(horizon)}")
    result = search(model, torch.as_tensor(np.concatenate(obs), dtype=torch.float32),
                    np.repeat([float(hp["discount"]) for hp in hps], n), np.repeat(sims, n), horizon.pop(), noise,
                    np.repeat([float(hp["exploration_fraction"]) for hp in hps], n),
                    gumbel=np.repeat(gumbel, n), gumbel_noise=gumbel_noise,
                    max_considered_actions=np.repeat([int(hp.get("max_considered_actions", 16)) for hp in hps], n))
    rows = [slice(m * n, (m + 1) * n) for m in range(len(hps))]
    return [SearchResult(result.visit_counts[r], result.root_values[r], result.policy[r], result.root_prior[r],
                         None if result.action is None else result.action[r])
            for r in rows]


class FusedEfficientZero:
    """Trains and evaluates groups of EfficientZero members fused; keeps one `FusedGroup` per
    architecture key between calls (slots are reloaded in place each generation: no new shapes)."""

    def __init__(self, compile: bool = False) -> None:
        self.compile = compile
        self.groups: dict[str, FusedGroup] = {}
        self.targets: dict[int, StackedModules] = {}  # id(group) -> its members' target networks, slot for slot
        self._warned = False
        self._warned_autocast = False

    # ---- grouping ---------------------------------------------------------------------------
    def group_key(self, agent: Any) -> str | None:
        """Members with equal keys can be fused: same networks, batch size, unroll and LSTM horizon."""
        bn = batchnorm_modules(agent.model)
        if bn:
            if not self._warned:
                warnings.warn(f"fused training: EfficientZero member {agent.index} has BatchNorm ({bn[0]}); "
                              f"training such members one by one (norm_type = 'LN' fuses)", stacklevel=2)
                self._warned = True
            return None
        hp = agent.hparams
        return architecture_key(agent.model, [int(hp["batch_size"]), int(hp["num_unroll_steps"]),
                                              int(hp["lstm_horizon_len"])])

    def _group(self, agents: Sequence[Any]) -> FusedGroup:
        key = self.group_key(agents[0])
        if key is None or any(self.group_key(a) != key for a in agents):
            raise ValueError("FusedEfficientZero: a group's members must share one architecture key")
        if not self._warned_autocast and any(learner.effective_autocast(a.task.get("autocast", "off"), a.model) != "off"
                                             for a in agents):
            warnings.warn("fused training: task.autocast applies to members trained one by one; a fused group "
                          "trains in the networks' own dtype", stacklevel=2)
            self._warned_autocast = True
        group = self.groups.get(key)
        if group is None or group.capacity < len(agents):
            template = copy.deepcopy(agents[0].model)
            hp = agents[0].hparams
            group = FusedGroup(template, len(agents), learner.fused_loss(template, int(hp["lstm_horizon_len"])),
                               scalars=dict.fromkeys(learner.WEIGHT_NAMES, 0.0), compile=self.compile)
            self.groups[key] = group
            self.targets[id(group)] = StackedModules(template, group.capacity)
        for slot in range(group.capacity):
            group.release(slot)
        for slot, agent in enumerate(agents):
            self.targets[id(group)].load(slot, agent.target_model)
            settings = agent.optimizer.param_groups
            if len(settings) != 1 or settings[0].get("amsgrad") or settings[0].get("maximize"):
                raise ValueError("FusedEfficientZero: expected one plain Adam param group per member")
            s = settings[0]
            group.load(slot, agent.model, optimizer_state(agent.optimizer, agent.model)["state"],
                       scalars={w: float(agent.hparams.get(w, 0.0)) for w in learner.WEIGHT_NAMES},
                       lr=float(s["lr"]), beta1=float(s["betas"][0]), beta2=float(s["betas"][1]), eps=float(s["eps"]),
                       weight_decay=float(s["weight_decay"]), max_grad_norm=float(agent.hparams["grad_clip"]))
        return group

    def _bootstrap(self, group: FusedGroup, obs: dict[int, torch.Tensor]) -> dict[int, np.ndarray]:
        """`learner.bootstrap_values` of several members' windows ({slot: [B, L, ...]}) in one vmapped
        call over their target networks; windows shorter than the longest (smaller td_steps) are padded."""
        targets = self.targets[id(group)]
        slots = sorted(obs)
        B = {o.shape[0] for o in obs.values()}
        if len(B) != 1:
            raise ValueError(f"fused bootstrap: members of a group share batch_size, found {sorted(B)}")
        b, L = B.pop(), max(o.shape[1] for o in obs.values())
        first = obs[slots[0]]
        x = first.new_zeros((len(slots), b, L, *first.shape[2:]))
        for i, m in enumerate(slots):
            x[i, :, : obs[m].shape[1]] = obs[m]
        x, index = x.to(targets.device), torch.as_tensor(slots, device=targets.device)
        params = {k: v.index_select(0, index) for k, v in targets.params.items()}
        buffers = {k: v.index_select(0, index) for k, v in targets.buffers.items()}
        one = lambda p, bf, rows: call_method(targets.template, p, bf, _initial, rows)
        with torch.no_grad():
            _, _, value_logits = vmap(one)(params, buffers, x.reshape(len(slots), b * L, *first.shape[2:]))
            template = targets.template
            values = support_to_scalar(value_logits, template.value_support, template.support_step)
            values = values.reshape(len(slots), b, L).cpu().numpy()
        return {m: values[i, :, : obs[m].shape[1]] for i, m in enumerate(slots)}

    def _search_model(self, group: FusedGroup, members: int) -> StackedSearchModel:
        params = {k: v[:members] for k, v in group.stack.params.items()}
        buffers = {k: v[:members] for k, v in group.stack.buffers.items()}
        return StackedSearchModel(group.stack.template, params, buffers, members)

    @staticmethod
    def _write_back(group: FusedGroup, agents: Sequence[Any]) -> None:
        for slot, agent in enumerate(agents):
            group.read(slot, agent.model)
            saved = optimizer_state(agent.optimizer, agent.model)
            saved["state"] = group.optimizer_state(slot)
            agent.optimizer.state.clear()
            load_optimizer_state(agent.optimizer, agent.model, saved)

    # ---- training -----------------------------------------------------------------------------
    def train(self, agents: Sequence[Any], steps: int) -> list[dict[str, float] | BaseException]:
        """Each member's `train(steps)`, fused; per member its metrics, or the exception that stopped it."""
        prepare_training_thread(1)  # as a member's own train()
        t0 = time.perf_counter()
        group = self._group(agents)
        M = len(agents)
        model = self._search_model(group, M)
        learned: list[dict[str, list[float]]] = [{} for _ in agents]
        outcome: list[Any] = [None] * M
        segments = [a.selfplay.segment(a.hparams, a.rng, a.replay, a.index, steps, None, a.env_steps) for a in agents]
        obs = [next(seg) for seg in segments]
        live = list(range(M))
        while live:
            results = search_members(StackedSearchModel(model.template, {k: v[live] for k, v in model.params.items()},
                                                        {k: v[live] for k, v in model.buffers.items()}, len(live))
                                     if len(live) < M else model,
                                     [obs[m] for m in live], [agents[m].hparams for m in live], [agents[m].rng for m in live])
            stepped = []
            for m, result in zip(live, results):
                try:
                    if segments[m].send(result) is not None:
                        raise RuntimeError("segment: expected a learning point after the vector step")
                    stepped.append(m)
                except StopIteration as stop:  # pragma: no cover - segments end at a learning point's resume
                    outcome[m] = stop.value
            n = int(agents[0].task["num_envs"])
            self._learn(group, agents, stepped, n, learned, outcome)
            live = []
            for m in stepped:
                if isinstance(outcome[m], BaseException):
                    continue
                try:
                    obs[m] = next(segments[m])
                    live.append(m)
                except StopIteration as stop:
                    outcome[m] = stop.value
        self._write_back(group, agents)
        wall = time.perf_counter() - t0
        out: list[dict[str, float] | BaseException] = []
        for m, agent in enumerate(agents):
            if isinstance(outcome[m], BaseException):
                out.append(outcome[m])
                continue
            finished = outcome[m] or []
            agent.last_train_seconds = wall  # the group's wall time: its members trained as one program
            metrics = {k: float(np.mean(v)) for k, v in learned[m].items()}
            metrics.update({"env_steps": float(agent.env_steps), "updates": float(agent.updates),
                            "train_episodes": float(len(finished)), "train_seconds": wall,
                            "carry_restarts": float(agent.selfplay.carry_restarts), "fused_group_size": float(M)})
            if finished:
                metrics["train_episode_return"] = float(np.mean(finished))
            out.append(metrics)
        return out

    def _learn(self, group: FusedGroup, agents: Sequence[Any], stepped: list[int], n: int,
               learned: list[dict[str, list[float]]], outcome: list[Any]) -> None:
        """What each member's `_learn_after(n)` does, with the gradient steps of a round fused."""
        for m in stepped:
            a = agents[m]
            a.env_steps += n
            a.update_credit += n * float(a.hparams["replay_ratio"])
        while True:
            round_ = [m for m in stepped if not isinstance(outcome[m], BaseException)
                      and agents[m].update_credit >= 1.0 and agents[m]._ready()]
            if not round_:
                break
            windows = {}
            for m in round_:
                a = agents[m]
                a.update_credit -= 1.0
                windows[m] = learner.sample_windows(a.replay, a.hparams)
            boot = self._bootstrap(group, {m: learner.window_obs(seq) for m, seq in windows.items()})
            batches = {m: learner.batch_from_windows(windows[m], boot[m], agents[m].target_model, agents[m].hparams,
                                                     agents[m].rng) for m in round_}
            mask = torch.zeros(group.capacity, dtype=torch.bool)
            mask[round_] = True
            terms = group.step(stack_batches({m: b.tensors for m, b in batches.items()}, group.capacity), mask)
            for m in round_:
                a, batch = agents[m], batches[m]
                total = float(terms["loss_total"][m])
                if not math.isfinite(total):
                    outcome[m] = Diverged(f"loss_total is {total}")
                    group.release(m)
                    continue
                a.updates += 1
                if a.updates % int(a.hparams["target_update_interval"]) == 0:
                    group.read(m, a.target_model)
                    self.targets[id(group)].load(m, a.target_model)
                priorities = np.abs(terms["root_value"][m].cpu().numpy() - batch.root_target) + 1e-6
                a.replay.update_priorities(batch.keys, priorities)
                row = {name: float(terms[name][m]) for name in learner.reported_terms(a.hparams)}
                row.update({"loss_total": total, "grad_norm": float(terms["grad_norm"][m]),
                            "target_value_mean": float(batch.root_target.mean())})
                for k, v in row.items():
                    learned[m].setdefault(k, []).append(v)
        for m in stepped:
            a = agents[m]
            a.update_credit = min(a.update_credit, 4.0 * n)

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, agents: Sequence[Any]) -> list[Evaluation]:
        """Each member's `evaluate()`, with all members' searches fused; `eval_seconds` (and its share
        `eval_seconds_share`) is the group's evaluation wall time, as `train_seconds` is its training's."""
        prepare_training_thread(1)
        t0 = time.perf_counter()
        group = self._group(agents)
        M = len(agents)
        model = self._search_model(group, M)
        games = [a.selfplay.evaluation(a.context.seed) for a in agents]
        obs: list[Any] = [next(g) for g in games]
        done: list[dict[str, float] | None] = [None] * M
        live = list(range(M))
        while live:
            sub = model if len(live) == M else StackedSearchModel(
                model.template, {k: v[live] for k, v in model.params.items()},
                {k: v[live] for k, v in model.buffers.items()}, len(live))
            results = search_members(sub, [obs[m] for m in live], [agents[m].hparams for m in live], None, evaluation=True)
            still = []
            for m, result in zip(live, results):
                try:
                    obs[m] = games[m].send(result)
                    still.append(m)
                except StopIteration as stop:
                    done[m] = stop.value
            live = still
        seconds = time.perf_counter() - t0
        out = []
        for agent, metrics in zip(agents, done):
            metrics = dict(metrics or {})
            metrics.update({"env_steps": float(agent.env_steps), "updates": float(agent.updates), "eval_seconds": seconds,
                            "eval_seconds_share": seconds / max(seconds + agent.last_train_seconds, 1e-9)})
            out.append(Evaluation(fitness=metrics["eval_return"], metrics=metrics))
        return out
