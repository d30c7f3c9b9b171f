"""`AgentContract`: the checks every agent class must pass, as a pytest test class to subclass.

Any agent — evo's own or a user's `package.module:Class` — runs the same suite by subclassing
`AgentContract` in a test file and saying which class to build and how (the Optuna / SB3 pattern):

    from evo.testing import AgentContract
    from mypackage.agent import MyAgent

    class TestMyAgent(AgentContract):
        agent_class = MyAgent
        task = {"env_id": "CartPole-v1"}     # the experiment file's [agent.task]
        arch = {"hidden": 32}                # [agent.arch]
        hparams = {"lr": 1e-3}               # [agent.hparams] values (must lie within the declared ranges)
        train_steps = 4                      # a few steps of the agent's own unit: keep it fast

        def probe(self, agent):              # optional: enables the function-preservation check
            return {"out": agent.net(FIXED_INPUT)}

Members are built the way the engine builds them (validated task and arch, every declared
hyperparameter filled in, a replay store from `replay_spec`), so what passes here runs in `evo run`.
pytest is needed only to run the suite: this module imports it lazily, for skips.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from evo.agent import Agent, AgentContext, Evaluation, TorchAgent, clone_tree
from evo.checkpoint import flatten_state, load_state, save_state
from evo.hparams import HParam, mutate_hparams, parse_hparam
from evo.records import MutationRecord
from evo.replay.protocol import ReplaySpec, build_replay
from evo.testing.compare import assert_same_state, metric_differences, shared_tensors, state_differences, timing_names

__all__ = ["AgentContract"]

# new_layer_prob for successive architecture mutations: layer changes, node changes, either
_NEW_LAYER_PROBS = (1.0, 0.0, 0.5)


class AgentContract:
    """The Agent protocol's contract (docs/agents.md); subclass it as `Test<Something>` to run it.

    Configure with class attributes; override the hooks (`probe`, `arch_bound_violations`,
    `make_context`) where an agent needs more than the defaults.
    """

    #: the class under test (required)
    agent_class: ClassVar[type[Agent]]
    #: the experiment's [agent.task], [agent.arch] and [agent.hparams] (values only) tables
    task: ClassVar[dict[str, Any]] = {}
    arch: ClassVar[dict[str, Any]] = {}
    hparams: ClassVar[dict[str, Any]] = {}
    #: steps per `train` call in the checks; enough that the optimizer has state, small enough to be fast
    train_steps: ClassVar[int] = 4
    #: the run seed in every context (evaluation seeds derive from it)
    run_seed: ClassVar[int] = 0
    #: largest |Δ| allowed in `probe` outputs across a mutation whose record says `function_preserving`
    #: (0.0: the agent promises bit-identical outputs)
    growth_atol: ClassVar[float] = 1e-6
    #: architecture mutations per phase of the mutation checks (the growth check cycles new_layer_prob
    #: 1, 0, ½; the bounds check draws this many at 1, then at 0, then at ½)
    mutation_rounds: ClassVar[int] = 10
    #: metric names that measure wall-clock time, left out when runs are compared for equality (names
    #: containing "seconds" or ending in "_s" are taken as timings without being listed)
    timing_metrics: ClassVar[frozenset[str]] = frozenset()

    # ---- hooks --------------------------------------------------------------------------------
    def probe(self, agent: Agent) -> dict[str, torch.Tensor] | None:
        """The function the agent computes on fixed inputs (e.g. policy logits and values for a fixed
        batch of observations), to check mutations that declare themselves function-preserving.
        None (the default) skips that check."""
        return None

    def arch_bound_violations(self, agent: Agent) -> list[str]:
        """Architecture values outside their declared bounds, as readable lines ([] when all hold).

        Default, following `EvolvableMLP`'s bound names: every list-valued `*blocks` key has
        `min_blocks..max_blocks` entries, each within `min_hidden..max_hidden`; every integer
        `*width` key lies within `min_width..max_width`; and any other `min_X` / `max_X` bounds
        the key `X` (a list by its length). Override (and extend `super()`'s list) for others.
        """
        arch = agent.arch
        out: list[str] = []

        def check(name: str, value: float, lo_key: str, hi_key: str) -> None:
            lo, hi = arch.get(lo_key), arch.get(hi_key)
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                out.append(f"arch.{name} = {value}: outside [{lo_key}={lo}, {hi_key}={hi}]")

        for key, value in arch.items():
            if key.startswith(("min_", "max_")):
                continue
            if key.endswith("blocks") and isinstance(value, list):
                check(f"{key} (count)", len(value), "min_blocks", "max_blocks")
                for i, hidden in enumerate(value):
                    check(f"{key}[{i}]", hidden, "min_hidden", "max_hidden")
            elif key.endswith("width") and isinstance(value, int) and not isinstance(value, bool):
                check(key, value, "min_width", "max_width")
        bounded = {k[4:] for k in arch if k.startswith(("min_", "max_"))}
        for name in sorted(bounded - {"blocks", "hidden", "width"}):
            if name in arch and not isinstance(arch[name], bool):
                value = arch[name]
                if isinstance(value, list):
                    check(f"{name} (count)", len(value), f"min_{name}", f"max_{name}")
                elif isinstance(value, numbers.Real):
                    check(name, value, f"min_{name}", f"max_{name}")
        return out

    def make_context(self) -> AgentContext:
        """A run's shared context: the validated task and, if the agent asks for one, a fresh
        in-process replay store (every call builds a new one, so members made from different
        contexts cannot influence each other)."""
        task = self.agent_class.validate_task(dict(self.task))
        spec = self.agent_class.replay_spec(task)
        replay = build_replay(spec, self.run_seed, distributed=False) if spec is not None else None
        return AgentContext(task=task, replay=replay, seed=self.run_seed)

    def copy_context(self, context: AgentContext, directory: Path) -> AgentContext:
        """A context whose replay store holds exactly what `context`'s holds (through a snapshot), so a
        restored member can continue in step with the original without sharing its store."""
        if context.replay is None:
            return dataclasses.replace(context)
        spec: ReplaySpec | None = self.agent_class.replay_spec(context.task)
        assert spec is not None, f"{self.agent_class.__name__}: a context has a replay store but replay_spec() is None"
        context.replay.snapshot(directory)
        fresh = build_replay(dataclasses.replace(spec, initial_rows=None), self.run_seed, distributed=False)
        fresh.load_snapshot(directory)
        return dataclasses.replace(context, replay=fresh)

    # ---- building members like the engine does --------------------------------------------------
    def hparam_space(self) -> dict[str, HParam]:
        """The declared hyperparameters with this test's values, checked like an experiment file's."""
        defaults = self.agent_class.default_hparams()
        unknown = sorted(set(self.hparams) - set(defaults))
        if unknown:
            raise ValueError(f"{type(self).__name__}.hparams.{unknown[0]}: not declared by "
                             f"{self.agent_class.__name__}.default_hparams(); expected some of {sorted(defaults)}")
        return {name: parse_hparam(name, self.hparams[name], hp) if name in self.hparams else hp
                for name, hp in defaults.items()}

    def make_agent(self, seed: int = 1, index: int = 0, context: AgentContext | None = None) -> Agent:
        """A founder as `evo run` builds one: validated arch, every hyperparameter given a value."""
        context = context or self.make_context()
        arch = self.agent_class.validate_arch(dict(self.arch))
        values = {name: hp.value for name, hp in self.hparam_space().items()}
        agent = self.agent_class.create(arch, values, seed, index, context)
        assert isinstance(agent, self.agent_class), (
            f"{self.agent_class.__name__}.create returned a {type(agent).__name__}")
        return agent

    # ---- shared checks --------------------------------------------------------------------------
    def check_metrics(self, where: str, metrics: Any) -> None:
        assert isinstance(metrics, dict), f"{where}: expected a dict of named metrics, found {type(metrics).__name__}"
        for name, value in metrics.items():
            assert isinstance(name, str), f"{where}: metric name {name!r} is not a str"
            assert isinstance(value, numbers.Real) and not isinstance(value, bool), (
                f"{where}: metric {name!r} = {value!r} is not a real number")
            assert math.isfinite(float(value)), f"{where}: metric {name!r} = {value!r} is not finite"

    def check_record(self, where: str, record: Any) -> None:
        assert isinstance(record, MutationRecord), (
            f"{where}: expected an evo.records.MutationRecord, found {type(record).__name__}")
        assert isinstance(record.op, str) and record.op, f"{where}: record.op must name the operation"
        assert record.function_preserving in (True, False, None), (
            f"{where}: function_preserving must be True, False or None, found {record.function_preserving!r}")
        data = record.to_json()
        try:
            text = json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise AssertionError(f"{where}: record.to_json() is not plain JSON ({exc}): {data!r}") from None
        again = MutationRecord.from_json(json.loads(text))
        assert again is not None and again.op == record.op and again.function_preserving == record.function_preserving

    def check_bounds(self, where: str, agent: Agent) -> None:
        violations = self.arch_bound_violations(agent)
        assert not violations, f"{where}: " + "; ".join(violations)
        try:
            self.agent_class.validate_arch(dict(agent.arch))
        except ValueError as exc:
            raise AssertionError(f"{where}: the member's arch is no longer one validate_arch accepts ({exc})") from None

    def check_preserved(self, where: str, record: MutationRecord, before: dict[str, torch.Tensor] | None,
                        agent: Agent) -> bool:
        """If `record` declares the function unchanged, `probe` must agree; True when that was checked."""
        if not record.function_preserving or before is None:
            return False
        after = self.probe(agent)
        assert after is not None and set(after) == set(before), f"{where}: probe() outputs changed names"
        for name in before:
            a, b = before[name].detach().double().cpu(), after[name].detach().double().cpu()
            assert a.shape == b.shape, (
                f"{where} ({record.op}): probe output {name!r} changed shape {tuple(a.shape)} → {tuple(b.shape)}")
            delta = float((a - b).abs().max()) if a.numel() else 0.0
            assert delta <= self.growth_atol, (
                f"{where} ({record.op}) declares function_preserving but probe output {name!r} moved by {delta:.3g} "
                f"(allowed {self.growth_atol:g})")
        return True

    def live_tensors(self, agent: Agent) -> dict[str, Any]:
        """The tensors a TorchAgent trains with (weights and optimizer state), by reference."""
        assert isinstance(agent, TorchAgent)
        return {"networks": {n: m.state_dict() for n, m in agent.networks().items()},
                "optimizers": [o.state_dict()["state"] for o in agent.optimizers()]}

    def _assert_same_run(self, what: str, ma: dict[str, Any], mb: dict[str, Any]) -> None:
        diffs = metric_differences(ma, mb, timing_names(ma, mb, extra=self.timing_metrics))
        assert not diffs, f"{what}: metrics differ (list wall-clock metrics in timing_metrics): {diffs}"

    # ---- the contract -------------------------------------------------------------------------
    def test_declarations_have_the_documented_types(self) -> None:
        cls = self.agent_class
        space = cls.default_hparams()
        assert isinstance(space, dict) and all(isinstance(h, HParam) for h in space.values()), (
            "default_hparams() must map names to evo.hparams.HParam")
        assert isinstance(cls.default_arch(), dict), "default_arch() must return a dict"
        task = cls.validate_task(dict(self.task))
        assert isinstance(task, dict), "validate_task() must return the completed task dict"
        assert cls.validate_task(dict(task)) == task, "validate_task() must accept its own output unchanged"
        spec = cls.replay_spec(task)
        assert spec is None or isinstance(spec, ReplaySpec), "replay_spec() must return a ReplaySpec or None"
        self.hparam_space()  # this test's values lie within the declared ranges

    def test_create_is_seeded_and_reproducible(self) -> None:
        a, b = self.make_agent(seed=7), self.make_agent(seed=7)
        assert_same_state(a.get_state(), b.get_state(), "two members created with seed 7")
        other = self.make_agent(seed=8)
        if isinstance(a, TorchAgent):
            weights = {n: m.state_dict() for n, m in a.networks().items()}
            assert state_differences(weights, {n: m.state_dict() for n, m in other.networks().items()}), (
                "seeds 7 and 8 gave identical initial weights: create() ignores its seed")
        else:
            assert state_differences(a.get_state(), other.get_state()), "seeds 7 and 8 gave identical members"
        self._assert_same_run("train() of two seed-7 members", a.train(self.train_steps), b.train(self.train_steps))
        assert_same_state(a.get_state(), b.get_state(), "two seed-7 members after the same training")
        ea, eb = a.evaluate(), b.evaluate()
        assert ea.fitness == eb.fitness, f"two seed-7 members evaluate to {ea.fitness} and {eb.fitness}"
        self._assert_same_run("evaluate() of two seed-7 members", ea.metrics, eb.metrics)

    def test_train_and_evaluate_return_the_documented_types(self) -> None:
        agent = self.make_agent()
        self.check_metrics("train()", agent.train(self.train_steps))
        evaluation = agent.evaluate()
        assert isinstance(evaluation, Evaluation), f"evaluate(): expected an evo.agent.Evaluation, found {evaluation!r}"
        fitness = evaluation.fitness
        assert isinstance(fitness, numbers.Real) and not isinstance(fitness, bool) and math.isfinite(float(fitness)), (
            f"evaluate(): fitness must be a finite real number, found {fitness!r}")
        self.check_metrics("evaluate().metrics", evaluation.metrics)
        try:
            flatten_state(agent.get_state())
        except TypeError as exc:
            raise AssertionError(f"get_state(): tensors, numpy arrays and JSON scalars only ({exc})") from None

    def clone_calls(self, parent: Agent) -> list[tuple[str, Callable[[], Agent]]]:
        """How the independence check clones: `clone(index)`, and `clone(index, seed)` where the
        agent's clone takes a seed (a child with random streams of its own)."""
        calls: list[tuple[str, Callable[[], Agent]]] = [("clone(103)", lambda: parent.clone(103))]
        if "seed" in inspect.signature(parent.clone).parameters:
            calls.append(("clone(104, seed=5)", lambda: parent.clone(104, seed=5)))  # type: ignore[call-arg]
        return calls

    def test_clone_is_independent_of_its_parent(self) -> None:
        parent = self.make_agent(index=3)
        parent.train(self.train_steps)
        rng = np.random.default_rng(11)
        for name, make_clone in self.clone_calls(parent):
            child = make_clone()
            assert type(child) is type(parent) and child is not parent, f"{name} returned {child!r}"
            assert child.index != 3 and parent.index == 3, f"{name} must set the child's index, not the parent's"
            assert child.arch == parent.arch and child.hparams == parent.hparams, f"{name} must carry arch and hparams"
            assert child.arch is not parent.arch and child.hparams is not parent.hparams, f"{name} must own its dicts"
            if isinstance(parent, TorchAgent):
                mine, theirs = self.live_tensors(parent), self.live_tensors(child)
                assert_same_state(mine, theirs, f"{name}: weights and optimizer state carried from the parent")
                shared = shared_tensors(mine, theirs)
                assert not shared, f"{name} shares {len(shared)} tensor(s) with its parent, e.g. {shared[:3]}"
            # whatever happens to the child leaves the parent exactly where it was — and the other way round
            parent_before = clone_tree(parent.get_state())
            child.train(self.train_steps)
            child.perturb_parameters(rng, 0.5)
            child.mutate_architecture(rng, 1.0)
            new_values = {k: new for k, (_, new) in mutate_hparams(self.hparam_space(), child.hparams, rng, n=99).items()}
            child.set_hparams(new_values)
            child.train(self.train_steps)
            assert_same_state(parent.get_state(), parent_before, f"the parent after its {name} trained and mutated")
            child_before = clone_tree(child.get_state())
            parent.train(self.train_steps)
            assert_same_state(child.get_state(), child_before, f"{name} after its parent trained")

    def test_state_round_trip_resumes_bit_identically(self, tmp_path: Path) -> None:
        original = self.make_agent()
        original.train(self.train_steps)
        save_state(tmp_path / "checkpoint", original.get_state())
        state, _ = load_state(tmp_path / "checkpoint")
        restored = self.agent_class.from_state(state, self.copy_context(original.context, tmp_path / "replay"))
        assert type(restored) is type(original)
        assert_same_state(restored.get_state(), original.get_state(), "from_state(get_state()) through a checkpoint")
        self._assert_same_run("train() after restoring", original.train(self.train_steps),
                              restored.train(self.train_steps))
        assert_same_state(restored.get_state(), original.get_state(), "the restored member after training on")
        ea, eb = original.evaluate(), restored.evaluate()
        assert ea.fitness == eb.fitness, f"the original evaluates to {ea.fitness}, the restored member to {eb.fitness}"
        self._assert_same_run("evaluate() after restoring", ea.metrics, eb.metrics)

    def test_architecture_mutations_return_records_and_keep_bounds(self) -> None:
        agent = self.make_agent()
        agent.train(self.train_steps)
        rng = np.random.default_rng(5)
        # growth is usually preferred: runs of layer mutations, then of node mutations, press on the bounds
        schedule = [1.0] * self.mutation_rounds + [0.0] * self.mutation_rounds + [0.5] * self.mutation_rounds
        for i, new_layer_prob in enumerate(schedule):
            where = f"mutate_architecture round {i} (new_layer_prob {new_layer_prob})"
            record = agent.mutate_architecture(rng, new_layer_prob)
            self.check_record(where, record)
            self.check_bounds(where, agent)
        self.check_metrics("train() after architecture mutations", agent.train(self.train_steps))
        restored = self.agent_class.from_state(clone_tree(agent.get_state()), agent.context)
        assert restored.arch == agent.arch, "a mutated member's state must rebuild the mutated architecture"

    def test_growth_mutations_preserve_the_function_where_declared(self) -> None:
        agent = self.make_agent()
        if self.probe(agent) is None:
            import pytest

            pytest.skip(f"{type(self).__name__} defines no probe(): nothing to compare outputs with")
        agent.train(self.train_steps)
        rng = np.random.default_rng(6)
        checked = []
        for i in range(self.mutation_rounds):
            before = self.probe(agent)
            record = agent.mutate_architecture(rng, _NEW_LAYER_PROBS[i % 3])
            if self.check_preserved(f"mutate_architecture round {i}", record, before, agent):
                checked.append(record.op)
        before = self.probe(agent)
        record = agent.set_activation(str(agent.arch.get("activation", "")))
        if self.check_preserved("set_activation(the current activation)", record, before, agent):
            checked.append(record.op)
        if not checked:
            import pytest

            pytest.skip(f"no mutation in {self.mutation_rounds + 1} draws declared function_preserving")

    def test_parameter_and_activation_mutations_return_records(self) -> None:
        agent = self.make_agent()
        agent.train(self.train_steps)
        rng = np.random.default_rng(7)
        before = clone_tree(agent.get_state())
        probe = self.probe(agent)
        record = agent.perturb_parameters(rng, 0.1)
        self.check_record("perturb_parameters", record)
        self.check_preserved("perturb_parameters", record, probe, agent)
        if record.op != "none":
            assert state_differences(agent.get_state(), before), f"perturb_parameters returned {record.op!r} but changed nothing"
        current = agent.arch.get("activation")
        for name in self.activation_choices(agent):
            probe = self.probe(agent)
            record = agent.set_activation(name)
            self.check_record(f"set_activation({name!r})", record)
            self.check_preserved(f"set_activation({name!r})", record, probe, agent)
            if record.op != "none" and current is not None:
                assert agent.arch.get("activation") == name, f"set_activation({name!r}) left arch.activation unchanged"
        self.check_metrics("train() after parameter/activation mutations", agent.train(self.train_steps))

    def activation_choices(self, agent: Agent) -> list[str]:
        """Activations `set_activation` is tried with: another one, then back to the original."""
        from evo.evolvable import ACTIVATIONS

        current = agent.arch.get("activation")
        if current is None:
            return ["ReLU"]
        other = next(name for name in ("Tanh", "ReLU", *ACTIVATIONS) if name != current)
        return [other, str(current)]

    def test_inference_hparams_change_how_it_acts_not_what_it_learns(self) -> None:
        """`inference_hparams` (evo.inference searches them with evaluations alone): each is a declared
        hyperparameter, and two seed-7 members that differ only in them train to the same weights."""
        names = self.agent_class.inference_hparams
        space = self.agent_class.default_hparams()
        unknown = sorted(set(names) - set(space))
        assert not unknown, f"inference_hparams names {unknown}, which default_hparams() does not declare"
        if not names or not issubclass(self.agent_class, TorchAgent):
            return
        a, b = self.make_agent(seed=7), self.make_agent(seed=7)

        def other(name: str) -> Any:  # a value of the range that is not the member's
            hp, value = space[name], a.hparams[name]
            options = list(hp.choices or ()) if hp.kind == "choice" else [hp.max, hp.min]
            return next(o for o in options if o != value)

        changed = {n: other(n) for n in names if space[n].mutable}
        b.set_hparams(changed)
        a.train(self.train_steps)
        b.train(self.train_steps)
        assert_same_state(self.live_tensors(a), self.live_tensors(b),
                          f"two seed-7 members trained with {sorted(changed)} apart "
                          "(inference-only: learning must not read them)")

    def test_hparam_changes_reach_the_agent_and_stay_in_bounds(self) -> None:
        agent = self.make_agent()
        agent.train(self.train_steps)
        space = self.hparam_space()
        rng = np.random.default_rng(8)
        changes = mutate_hparams(space, agent.hparams, rng, n=len(space))
        values = {name: new for name, (_, new) in changes.items()}
        agent.set_hparams(values)
        for name, value in values.items():
            hp = space[name]
            assert agent.hparams[name] == value, f"set_hparams: hparams[{name!r}] is {agent.hparams[name]!r}, expected {value!r}"
            if hp.kind == "choice":
                assert value in (hp.choices or ()), f"{name} = {value!r} is not one of {hp.choices}"
            elif hp.min is not None:
                assert hp.min <= value <= hp.max, f"{name} = {value!r} outside [{hp.min}, {hp.max}]"
        if isinstance(agent, TorchAgent):
            for name in agent.OPTIMIZER_HPARAMS:
                if name in values:
                    for opt in agent.optimizers():
                        for group in opt.param_groups:
                            assert group[name] == values[name], f"set_hparams({name}={values[name]}) did not reach the optimizer"
        restored = self.agent_class.from_state(clone_tree(agent.get_state()), agent.context)
        assert restored.hparams == agent.hparams, "get_state() must carry the hyperparameters set_hparams adopted"
        self.check_metrics("train() after set_hparams", agent.train(self.train_steps))

    def test_export_then_load_round_trips(self, tmp_path: Path) -> None:
        from evo.registry import load

        agent = self.make_agent(index=5)
        agent.train(self.train_steps)
        out = agent.export(tmp_path / "export")
        loaded = load(out)
        assert type(loaded) is type(agent), f"evo.load rebuilt a {type(loaded).__name__}, not a {type(agent).__name__}"
        assert loaded.index == agent.index and loaded.arch == agent.arch and loaded.hparams == agent.hparams
        assert_same_state(loaded.get_state(), agent.get_state(), "an exported agent loaded back")
        ours, theirs = agent.evaluate(), loaded.evaluate()
        assert theirs.fitness == ours.fitness, f"the exported agent evaluates to {theirs.fitness}, the original to {ours.fitness}"
        self._assert_same_run("evaluate() of the exported agent", ours.metrics, theirs.metrics)

