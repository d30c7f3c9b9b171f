"""Experiment files: TOML in, one resolved `Experiment` out, or a `SpecError` a person can act on.

Every error names the file, the field, what was expected and what was found. The engine-level
tables are checked by pydantic (`ExperimentSpec`); the agent's own tables (task, arch, hparams)
by the agent class, which is the only place that knows them. The result carries the agent class
itself, so nothing downstream looks a kind up by name again.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evo.evolvable import ACTIVATIONS
from evo.hparams import HParam, HParamError, parse_hparam
from evo.inference import searchable

if TYPE_CHECKING:
    from evo.agent import Agent

__all__ = ["Experiment", "ExperimentSpec", "SpecError", "apply_overrides", "load_experiment", "parse_experiment",
           "parse_override"]


class SpecError(ValueError):
    """An experiment file that cannot be run. `str()` is the message shown to the person."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source, self.field, self.message = source, field, message
        super().__init__(f"{source}: {field}: {message}" if field else f"{source}: {message}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetSpec(_Strict):
    """A run's compute budget: exactly one unit. Counted over every member-round trained (docs/experiments.md)."""

    env_steps: int | None = Field(default=None, ge=1, description="environment steps (the agent's own `env_steps` "
                                                                  "counter, else its train unit)")
    updates: int | None = Field(default=None, ge=1, description="gradient updates (the agent's `updates` counter, "
                                                                "else its train unit)")
    member_seconds: float | None = Field(default=None, gt=0, description="seconds members spent training + evaluating")

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetSpec:
        given = [k for k in ("env_steps", "updates", "member_seconds") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of env_steps, updates, member_seconds, found {given or 'none'}")
        return self

    @property
    def unit(self) -> str:
        return next(k for k in ("env_steps", "updates", "member_seconds") if getattr(self, k) is not None)

    @property
    def amount(self) -> float:
        return float(getattr(self, self.unit))


class PopulationSpec(_Strict):
    size: int = Field(ge=1, le=4096, description="number of members")
    generations: int = Field(ge=1, description="generations to run")
    steps_per_generation: int = Field(ge=1, description="passed to agent.train(steps) each generation")
    initial: Literal["same", "sample", "scratch"] = Field(
        default="same", description="founders' hyperparameters: all the starting values, drawn from the ranges "
                                    "but member 0's ('sample'), or every founder's drawn ('scratch')")
    mode: Literal["sync", "async"] = Field(
        default="sync", description="sync: generations with a barrier (bit-reproducible); async: a member that ends "
                                    "its round is judged and continues or is replaced at once (docs/experiments.md)")
    budget: BudgetSpec | None = Field(default=None, description="stop when the run has spent this much compute "
                                                                "(besides the generations count)")
    stop_at_score: float | Literal["task"] | None = Field(
        default=None, description="stop once a member's score (its fitness_window mean) reaches this; 'task': the "
                                  "agent's threshold for its task (gymnasium's reward_threshold; none: no stop)")
    rungs: list[float] = Field(default_factory=list, description="async: early-stopping rungs inside a round, as "
                                                                 "fractions of its steps (e.g. [0.25, 0.5])")
    rung_keep: float = Field(default=0.5, gt=0, lt=1, description="at a rung, a member outside this top share of "
                                                                  "the round's members at that rung stops")
    rung_metric: str | None = Field(
        default=None, min_length=1, pattern=r"^-?[^-]",
        description="judge rungs on this training metric the agent reports (e.g. 'train_episode_return'; "
                    "'-loss' ranks lower first) instead of an evaluation: a rung then costs no evaluation, and a "
                    "member stopped there has none; None: the fitness of an evaluation at each rung")

    @field_validator("stop_at_score", mode="before")
    @classmethod
    def _number_or_task(cls, v: Any) -> Any:
        if v is None or v == "task" or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            return v
        raise ValueError(f"expected a finite number or \"task\" (the agent's threshold for its task), found {v!r}")

    @field_validator("rungs")
    @classmethod
    def _rungs_inside_a_round(cls, v: list[float]) -> list[float]:
        if any(not 0 < x < 1 for x in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"expected increasing fractions strictly between 0 and 1, found {v}")
        return v


class AgentSpec(_Strict):
    kind: str
    task: dict[str, Any] = Field(default_factory=dict)
    arch: dict[str, Any] = Field(default_factory=dict)
    hparams: dict[str, Any] = Field(default_factory=dict)


class SelectionSpec(_Strict):
    tournament_size: int = Field(default=2, ge=1)
    elitism: bool = True
    fitness_window: int = Field(default=1, ge=1, description="fitness = mean of the last k evaluations")
    equal_compute: Literal["none", "env_steps", "updates", "member_seconds"] = Field(
        default="none", description="judge members at equal compute of this unit (each by its line's score at the "
                                    "level every entrant reached); async mode compares at equal env_steps by default")
    secondary: str | None = Field(default=None, min_length=1,
                                  description="a metric the agent reports (evaluation, else training) that ranks "
                                              "members whose scores tie, e.g. 'train_episode_return'")
    tie_tolerance: float = Field(default=0.0, ge=0, description="scores this close count as tied")
    founder_lines: int = Field(default=0, ge=0, description="keep at least this many founders' lines alive "
                                                            "(each by its best member), so one founder cannot take all")
    keep_unbeaten: bool = Field(default=False, description="a member keeps its slot (continues unmutated) unless "
                                                           "its tournament's winner scores more than tie_tolerance "
                                                           "above it: no coin-toss overwrites while scores tie")
    replace_worst: int = Field(default=0, ge=0, description="sync, with keep_unbeaten: at least this many members "
                                                            "are replaced each generation (the lowest-scoring kept "
                                                            "ones first), so scores within tie_tolerance of each other "
                                                            "do not freeze the population")
    truncation: int = Field(default=0, ge=0, description="sync: instead of tournaments, exactly this many lowest-"
                                                         "scoring members are replaced each generation by mutated "
                                                         "clones of the highest-scoring ones, and every other member "
                                                         "trains on unmutated (PBT's exploit rule; at most half the "
                                                         "population)")
    rest_elite: bool = Field(default=False, description="sync: of a generation's members that survive into the next, "
                                                        "the one with the best last evaluation is evaluated there "
                                                        "without training (it rests) until another member evaluates "
                                                        "higher; its clones train on. The "
                                                        "best weights found are not lost to later training, and a "
                                                        "resting round spends no budget but its evaluation")
    rest_from: float | None = Field(default=None, allow_inf_nan=False,
                                    description="with rest_elite: the best survivor rests only once its last "
                                                "evaluation has reached this score (e.g. the task's maximum "
                                                "return, past which training can only lose it); until then every "
                                                "member trains. None: it rests from generation 1 on")
    clone_behind: bool = Field(default=True, description="async: a member may be replaced by a clone of a winner "
                                                         "with fewer rounds (false: it continues instead)")
    champion: bool = Field(default=False, description="async: the best state evaluated so far (by score) is kept out "
                                                      "of training and drawn into tournaments like a member; drawn, "
                                                      "and more than tie_tolerance above the winner's latest score, "
                                                      "its mutated clone takes the finisher's slot")
    champion_margin: float | None = Field(default=None, ge=0,
                                          description="with champion: it enters tournaments only while every member's "
                                                      "latest score is more than this below it (the population has "
                                                      "fallen from its peak); unset: always")


class MutationSpec(_Strict):
    """Relative probabilities of the mutation kinds (one is sampled per child) and their settings."""

    no_mutation: float = Field(default=0.4, ge=0)
    architecture: float = Field(default=0.2, ge=0)
    new_layer: float = Field(default=0.2, ge=0, le=1, description="within an architecture mutation: layer vs node")
    parameters: float = Field(default=0.2, ge=0)
    mutation_sd: float = Field(default=0.1, gt=0)
    activation: float = Field(default=0.0, ge=0)
    activation_choices: list[str] = Field(
        default_factory=lambda: ["ReLU", "GELU", "PReLU", "Tanh", "Sigmoid", "ELU", "Threshold"])
    rl_hp: float = Field(default=0.2, ge=0)
    rl_hp_count: int = Field(default=1, ge=1, description="hyperparameters changed by one rl_hp mutation")
    rl_hp_resample: float = Field(default=0.0, ge=0, le=1,
                                  description="the least chance that an rl_hp mutation draws a hyperparameter afresh "
                                              "from its whole range instead of growing or shrinking it (PBT's "
                                              "resample_probability; a hyperparameter's own resample_prob, if higher, wins)")
    model_guided: float = Field(default=0.0, ge=0, description="PB2-style: new hyperparameters where a Gaussian "
                                                               "process of (hyperparameters, round) -> score gain "
                                                               "has the highest upper confidence bound (scikit-learn)")
    inference_search: bool = Field(default=False, description="at every evaluation also evaluate each mutable "
                                                              "hyperparameter the agent names inference-only (it "
                                                              "changes how a member acts, not what it learns: ILQL's "
                                                              "inference_beta) at its value x and / inference_factor, "
                                                              "and keep the best (evo.inference): evaluations, not training")
    inference_factor: float = Field(default=2.0, gt=1, description="inference_search's step, as a factor")

    @field_validator("activation_choices")
    @classmethod
    def _known_activations(cls, v: list[str]) -> list[str]:
        unknown = [a for a in v if a not in ACTIVATIONS]
        if unknown:
            raise ValueError(f"expected activations from {sorted(ACTIVATIONS)}, found {unknown}")
        if not v:
            raise ValueError("expected at least one activation")
        return v

    @model_validator(mode="after")
    def _some_probability(self) -> MutationSpec:
        if self.weights().sum() <= 0:
            raise ValueError("expected at least one mutation kind with probability > 0")
        return self

    # model_guided last: a zero weight there leaves the draws of the others exactly as they were
    KINDS: ClassVar[tuple[str, ...]] = ("no_mutation", "architecture", "parameters", "activation", "rl_hp",
                                        "model_guided")

    def weights(self):
        import numpy as np

        return np.array([getattr(self, k) for k in self.KINDS], dtype=float)


class ResourcesSpec(_Strict):
    num_workers: int | None = Field(default=None, ge=1,
                                    description="Ray actors training members (default: min(population, CPUs))")
    cpus_per_member: float = Field(default=1.0, gt=0)
    gpus_per_member: float = Field(default=0.0, ge=0)
    address: str | None = None
    placement: Literal["spread", "default"] = Field(
        default="spread", description="where Ray puts member actors: 'spread' over as many nodes as possible, or "
                                      "Ray's 'default' (the driver's node first); docs/cluster.md")
    timeout_s: float = Field(default=3600.0, gt=0, description="a member that takes longer is reported as failed")
    fused: bool = Field(default=False, description="train members that share an architecture as one vectorised "
                                                   "program (inline, or per Ray actor; docs/fused.md)")
    fused_compile: bool = Field(default=False, description="torch.compile the fused step (minutes of compile time; "
                                                           "pays off only in long runs)")
    max_failures: int = Field(default=2, ge=0,
                              description="times one member is retried in a generation after its worker died (docs/faults.md)")
    custom_resources: dict[str, float] = Field(default_factory=dict,
                                               description="Ray custom resources each member's actor needs, e.g. {tpu = 1}")
    wait_for_resources_s: float = Field(default=0.0, ge=0,
                                        description="an autoscaling cluster: seconds to wait for the resources asked "
                                                    "to appear before failing (0: check once, fail at once)")

    @field_validator("custom_resources")
    @classmethod
    def _custom_names(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"expected a custom resource name, found {name!r} (use cpus_per_member / gpus_per_member)")
            if not amount > 0:
                raise ValueError(f"expected a positive amount for {name!r}, found {amount}")
        return v


class ReplayTable(_Strict):
    """How the run's shared replay store is deployed (what it holds is the agent kind's `replay_spec`)."""

    shards: int = Field(default=1, ge=1, description="replay actors the store is split over on the Ray backend, "
                                                     "rows routed by content key (docs/replay.md, Shards)")
    spread: bool = Field(default=False, description="place the replay actors with Ray's SPREAD strategy "
                                                    "(over the cluster's nodes)")
    own_share: float = Field(default=0.0, ge=0, le=1,
                             description="the least share of every batch a member draws from its own rows of the "
                                         "generation (0: rows in proportion to their sampling mass, as one store)")
    own_rows: Literal["generation", "line"] = Field(
        default="generation",
        description="what a member's own rows are: its inserts of this generation, or its line store ('line': "
                    "every row its line inserted, kept across generations with their priorities and copied to a "
                    "clone, as a PBT trial copies its parent's store; docs/replay.md, Member views)")


class LoggingSpec(_Strict):
    """Where else a run reports, besides its run store (both optional; extras `tensorboard`, `mlflow`)."""

    tensorboard: str | None = Field(default=None, min_length=1,
                                    description="directory for TensorBoard event files (one subdirectory per run)")
    mlflow: str | None = Field(default=None, min_length=1,
                               description="MLflow tracking directory (a file store) or tracking URI")


class ExperimentSpec(_Strict):
    """The experiment file's tables, checked; the agent's own tables are still raw here."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = 0
    backend: Literal["ray", "inline"] = "ray"
    population: PopulationSpec
    agent: AgentSpec
    selection: SelectionSpec = Field(default_factory=SelectionSpec)
    mutation: MutationSpec = Field(default_factory=MutationSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    replay: ReplayTable = Field(default_factory=ReplayTable)
    logging: LoggingSpec = Field(default_factory=LoggingSpec)

    @model_validator(mode="after")
    def _async_fits(self) -> ExperimentSpec:
        if self.population.rungs and self.population.mode != "async":
            raise ValueError("population.rungs: expected population.mode = 'async' (rungs stop rounds early, "
                             "inside asynchronous evolution), found mode 'sync'")
        if self.population.rung_metric is not None and not self.population.rungs:
            raise ValueError(f"population.rung_metric: expected population.rungs to judge on, found none "
                             f"(rung_metric = {self.population.rung_metric!r})")
        if self.selection.champion and self.population.mode != "async":
            raise ValueError("selection.champion: expected population.mode = 'async' (a synchronous run keeps its "
                             "elite with selection.elitism), found mode 'sync'")
        if self.selection.champion_margin is not None and not self.selection.champion:
            raise ValueError(f"selection.champion_margin: expected selection.champion = true (the margin gates the "
                             f"champion), found champion = false (champion_margin = {self.selection.champion_margin})")
        if self.selection.replace_worst and (self.population.mode != "sync" or not self.selection.keep_unbeaten):
            raise ValueError(f"selection.replace_worst: expected population.mode = 'sync' and selection.keep_unbeaten = "
                             f"true (without it every member but the elite is replaced already), found mode "
                             f"{self.population.mode!r}, keep_unbeaten {self.selection.keep_unbeaten}")
        if self.selection.truncation and (self.population.mode != "sync" or self.selection.keep_unbeaten
                                          or self.selection.founder_lines or self.selection.replace_worst):
            raise ValueError(f"selection.truncation: expected population.mode = 'sync' and no tournament rule "
                             f"(keep_unbeaten, founder_lines, replace_worst: truncation replaces the tournaments), "
                             f"found mode {self.population.mode!r}, keep_unbeaten {self.selection.keep_unbeaten}, "
                             f"founder_lines {self.selection.founder_lines}, replace_worst {self.selection.replace_worst}")
        if self.selection.rest_elite and (self.population.mode != "sync" or self.resources.fused):
            raise ValueError(f"selection.rest_elite: expected population.mode = 'sync' and resources.fused = false (a "
                             f"resting member skips a generation's training; fused members train in step; async "
                             f"runs keep theirs with selection.champion), found mode {self.population.mode!r}, "
                             f"fused {self.resources.fused}")
        if self.selection.rest_from is not None and not self.selection.rest_elite:
            raise ValueError(f"selection.rest_from: expected selection.rest_elite = true (the score gates which member "
                             f"rests), found rest_elite = false (rest_from = {self.selection.rest_from})")
        if self.replay.own_rows == "line" and self.population.mode != "sync":
            raise ValueError("replay.own_rows = 'line': expected population.mode = 'sync' (line stores pass from "
                             "generation to generation), found mode 'async'")
        if self.population.mode == "async" and self.resources.fused:
            raise ValueError("population.mode: expected 'sync' with resources.fused = true (fused members train as one "
                             "program, in step), found 'async'")
        if self.mutation.inference_search and self.resources.fused:
            raise ValueError("mutation.inference_search: expected resources.fused = false (a fused group evaluates as "
                             "one program, not a member at a time), found true")
        return self

    @model_validator(mode="after")
    def _tournament_fits(self) -> ExperimentSpec:
        if self.selection.tournament_size > self.population.size:
            raise ValueError(
                f"selection.tournament_size: expected at most population.size ({self.population.size}), "
                f"found {self.selection.tournament_size}"
            )
        if 2 * self.selection.truncation > self.population.size:
            raise ValueError(f"selection.truncation: expected at most half of population.size ({self.population.size}), "
                             f"found {self.selection.truncation}")
        if self.selection.replace_worst >= self.population.size:
            raise ValueError(f"selection.replace_worst: expected fewer than population.size ({self.population.size}), "
                             f"found {self.selection.replace_worst}")
        return self


@dataclass(frozen=True)
class Experiment:
    """A runnable experiment: the checked file, the agent class its kind names, and the agent's
    own tables as that class validated them (task, architecture, hyperparameter space)."""

    spec: ExperimentSpec
    agent_class: type[Agent]
    hparam_space: dict[str, HParam]
    task: dict[str, Any]
    arch: dict[str, Any]

    # the engine-level tables, read straight through
    name = property(lambda self: self.spec.name)
    seed = property(lambda self: self.spec.seed)
    backend = property(lambda self: self.spec.backend)
    population = property(lambda self: self.spec.population)
    selection = property(lambda self: self.spec.selection)
    mutation = property(lambda self: self.spec.mutation)
    resources = property(lambda self: self.spec.resources)
    replay = property(lambda self: self.spec.replay)
    logging = property(lambda self: self.spec.logging)

    @functools.cached_property
    def stop_score(self) -> float | None:
        """`population.stop_at_score` as a number: "task" asks the agent class for its task's threshold
        (None where it knows none: the run then stops on generations and budget alone)."""
        value = self.population.stop_at_score
        return self.agent_class.reward_threshold(self.task) if value == "task" else value

    def to_json(self) -> dict[str, Any]:
        """The checked file as JSON (what the run store keeps and `evo resume` parses again)."""
        return self.spec.model_dump(mode="json")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _from_pydantic(source: str, exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return SpecError(source, loc, "unknown field (check the spelling; see docs/experiments.md)")
    if kind == "missing":
        return SpecError(source, loc, "required field is missing")
    msg = msg.removeprefix("Value error, ")
    if msg.startswith("Input should be "):
        msg = msg.removeprefix("Input should be ")
        return SpecError(source, loc, f"expected {msg}, found {_describe(err.get('input'))}")
    if msg.startswith(("expected", "selection.", "population.")):
        if msg.startswith(("selection.", "population.")):
            field, _, rest = msg.partition(": ")
            return SpecError(source, field, rest)
        return SpecError(source, loc, f"{msg}")
    return SpecError(source, loc, f"expected {msg[0].lower()}{msg[1:]}, found {_describe(err.get('input'))}")


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")


def parse_override(text: str) -> tuple[str, Any]:
    """`population.size=8` -> ("population.size", 8): the value is read as a TOML value (numbers,
    booleans, strings, arrays, inline tables); a bare word that is not TOML is taken as a string
    (`backend=inline`). Raises `SpecError` (field "--set") for anything else."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not _KEY.match(key):
        raise SpecError("--set", "", f"expected KEY=VALUE with a dotted key (e.g. population.size=8), found {text!r}")
    if not raw:
        raise SpecError("--set", key, "expected a value after '='")
    try:
        return key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if raw[0] in "[{\"'" or not re.match(r"^[A-Za-z0-9_./:@+-]+$", raw):
            raise SpecError("--set", key, f"expected a TOML value (8, 0.01, true, \"text\", [1, 2], {{ a = 1 }}), "
                                          f"found {raw!r} ({exc})") from None
        return key, raw


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None, source: str = "<experiment>") -> dict[str, Any]:
    """A copy of `data` with each dotted key of `overrides` set (tables along the way are created,
    and copied, never changed in place). A plain hyperparameter value becomes a range table when a
    key inside it is set (`agent.hparams.lr.max` on `lr = 3e-3` gives `{ value = 3e-3, max = ... }`),
    and a plain value for a ranged one sets its starting value (`agent.hparams.lr=0.005` keeps the range).
    Setting a key inside anything else that is not a table is a `SpecError` naming the key."""
    out = dict(data)
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise SpecError(source, str(key), "expected a dotted key such as population.size")
        parts = key.split(".")
        target = out
        for depth, part in enumerate(parts[:-1]):
            inner = target.get(part, {})
            if not isinstance(inner, dict):
                here = ".".join(parts[: depth + 1])
                if parts[:2] == ["agent", "hparams"] and depth == 2:
                    inner = {"value": inner}  # a plain hyperparameter gets a range
                else:
                    raise SpecError(source, key, f"cannot set a key inside {here}, which is {_describe(inner)}, not a table")
            inner = dict(inner)
            target[part] = inner
            target = inner
        old = target.get(parts[-1])
        if parts[:2] == ["agent", "hparams"] and len(parts) == 3 and isinstance(old, dict) and not isinstance(value, dict):
            value = {**old, "value": value}  # a new starting value keeps the file's range
        target[parts[-1]] = value
    return out


def parse_experiment(data: dict[str, Any], source: str = "<experiment>",
                     overrides: dict[str, Any] | None = None) -> Experiment:
    """Validate a parsed TOML document, with `overrides` (dotted keys, e.g. {'population.size': 8})
    set first; an error in an overridden field says so."""
    data = apply_overrides(data, overrides, source)
    try:
        return _validate(data, source)
    except SpecError as exc:
        key = next((k for k in (overrides or {}) if _related(k, exc.field)), None)
        if key is None:
            raise
        raise SpecError(exc.source, exc.field, f"{exc.message} (set by the override {key}={_describe(overrides[key])})") from None


def _related(key: str, field: str) -> bool:
    return bool(field) and (key == field or key.startswith(field + ".") or field.startswith(key + "."))


def _validate(data: dict[str, Any], source: str) -> Experiment:
    try:
        exp = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        raise _from_pydantic(source, exc) from None

    from evo.registry import agent_class

    try:
        cls = agent_class(exp.agent.kind)
    except ValueError as exc:
        raise SpecError(source, "agent.kind", str(exc)) from None
    try:
        task = cls.validate_task(exp.agent.task)
        arch = cls.validate_arch(exp.agent.arch)
    except (ValueError, TypeError) as exc:
        field, sep, rest = str(exc).partition(": ")
        raise SpecError(source, f"agent.{field}" if sep else "agent", rest if sep else str(exc)) from None
    defaults = cls.default_hparams()
    unknown = sorted(set(exp.agent.hparams) - set(defaults))
    if unknown:
        raise SpecError(source, f"agent.hparams.{unknown[0]}",
                        f"unknown hyperparameter for {exp.agent.kind}; expected some of {sorted(defaults)}")
    space: dict[str, HParam] = {}
    for name, default in defaults.items():
        try:
            space[name] = parse_hparam(name, exp.agent.hparams[name], default) if name in exp.agent.hparams else default
        except HParamError as exc:
            field, _, rest = str(exc).partition(": ")
            sub, _, rest2 = rest.partition(": ")
            if sub in {"value", "min", "max", "min/max", "kind", "scale", "choices", "grow/shrink", "resample_prob"}:
                raise SpecError(source, f"agent.hparams.{field}.{sub.split('/')[0]}", rest2) from None
            raise SpecError(source, f"agent.hparams.{field}", rest) from None
    if exp.mutation.inference_search and not searchable(cls, space):
        raise SpecError(source, "mutation.inference_search",
                        f"agent kind {exp.agent.kind!r} has no mutable inference-only hyperparameter to search (it names "
                        f"{sorted(cls.inference_hparams) or 'none'}; give one a range)")
    return Experiment(exp, cls, space, task, arch)


def load_experiment(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[Experiment, str]:
    """Read, parse and validate an experiment file; returns (experiment, the file's text)."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(source, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(source, "", f"cannot read the file ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(source, "", f"malformed TOML: {exc}") from None
    return parse_experiment(data, source, overrides), text
