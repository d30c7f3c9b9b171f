"""The Python API: start a run with `evo.run`, open one with `evo.open_run`, read it as pandas.

    import evo
    run = evo.run("experiments/randomwalks_ilql.toml", overrides={"population.size": 2}, backend="inline")
    run.leaderboard()            # a DataFrame, elite first

`evo.run` takes what `evo run` takes (the command line is a thin layer over this module) and
validates the same way: bad input raises `evo.SpecError`, whose `.field` names the offending key
(the command line prints it and exits 2); nothing is created then. A run that fails raises
`RunFailed` (the command line's exit 1), keeping its last completed generation for `Run.resume()`.

Progress: a rich live view on a terminal, a plain line per generation elsewhere, nothing with
`quiet=True`. Under `quiet`, third-party progress bars and warnings (Hugging Face "Loading weights"
bars, Ray's start-up lines, Python warnings) are kept off the console too; every mode writes them,
with the per-generation lines, to the run directory's `run.log`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import warnings
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evo import interrupts
from evo.environ import environ_restored
from evo.spec import SpecError

if TYPE_CHECKING:
    import pandas as pd

    from evo.agent import Agent
    from evo.runstore import RunStore
    from evo.spec import Experiment

__all__ = ["Run", "RunFailed", "RunInterrupted", "SpecError", "open_run", "run", "LOG_NAME"]

LOG_NAME = "run.log"

#: loggers of the libraries a run drives, kept off the console under quiet (their records go to run.log)
THIRD_PARTY_LOGGERS = ("transformers", "ray", "torch", "gymnasium", "numba", "filelock", "urllib3")
#: read by those libraries when they are imported (Ray workers of a local cluster inherit them)
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


class RunFailed(RuntimeError):
    """A run stopped with an error; `run` is the `Run` (its last completed generation is kept:
    fix the cause, then `run.resume()`), `cause` the exception."""

    def __init__(self, run: Run, cause: BaseException) -> None:
        self.run, self.cause = run, cause
        super().__init__(f"run {run.name} failed: {type(cause).__name__}: {cause}; the last completed generation "
                         f"is kept; after fixing the cause: evo resume {run.name} (or Run.resume())")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run; `run` is the `Run`, resumable from its last completed generation."""

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"interrupted; resume with: evo resume {run.name} (or Run.resume())")


# ---- starting a run ---------------------------------------------------------------------------
def run(experiment: str | Path | dict[str, Any], *, overrides: dict[str, Any] | None = None,
        runs_dir: str | Path = "runs", name: str | None = None, backend: str | None = None,
        address: str | None = None, generations: int | None = None, seed: int | None = None,
        quiet: bool = False) -> Run:
    """Run an experiment to its last generation and return the `Run`.

    `experiment`: a path to a TOML file, TOML text, or a dict of the file's tables. `overrides`:
    dotted keys set on top (`{"population.size": 8, "agent.hparams.lr.max": 0.01}`), validated
    like the file and recorded in the run's stored experiment. `name` names the run directory under
    `runs_dir` (default: the experiment's name, suffixed `-2`, `-3`... when taken). `backend`,
    `address`, `generations`, `seed` override the experiment's. Ctrl-C stops the run resumably
    (KeyboardInterrupt is raised again)."""
    return start(experiment, overrides=overrides, runs_dir=runs_dir, name=name, backend=backend, address=address,
                 generations=generations, seed=seed, display="none" if quiet else "auto", quiet=quiet)


def start(experiment: str | Path | dict[str, Any], *, overrides: dict[str, Any] | None = None,
          runs_dir: str | Path = "runs", name: str | None = None, backend: str | None = None,
          address: str | None = None, generations: int | None = None, seed: int | None = None,
          display: str = "auto", quiet: bool = False) -> Run:
    """`run` with the display mode spelled out (evo.display.RunDisplay: auto, live, lines, none);
    the command line's `--quiet` is display "lines" with `quiet=True`."""
    from evo.loggers import check_logging
    from evo.runstore import RunStore, RunStoreError

    if backend is not None and backend not in ("ray", "inline"):
        raise SpecError("evo.run", "backend", f"expected 'ray' or 'inline', found {backend!r}")
    flags: dict[str, Any] = {}
    if seed is not None:
        flags["seed"] = seed
    if generations is not None:
        flags["population.generations"] = generations
    if backend is not None:
        flags["backend"] = backend
    all_overrides = {**(overrides or {}), **flags}
    exp, text, source = load(experiment, all_overrides)
    check_logging(exp, source)
    if exp.backend == "inline":  # a GPU request without CUDA is bad input: refuse before creating anything
        from evo.faults import ResourceRequestError
        from evo.scheduler.inline import inline_device

        try:
            inline_device(exp.resources.gpus_per_member)
        except ResourceRequestError as exc:
            raise SpecError(source, exc.field, str(exc).partition(": ")[2]) from None
    runs_dir = Path(runs_dir)
    name = name or free_name(runs_dir, exp.name)
    if overrides:
        note = "# overrides given to evo run (--set / overrides=), already in the stored experiment:\n"
        text = text.rstrip("\n") + "\n\n" + note + "".join(f"# {k} = {json.dumps(v, default=str)}\n"
                                                         for k, v in overrides.items())
    try:
        store = RunStore.create(runs_dir, name, text, exp.to_json(), source=source)
    except RunStoreError as exc:  # the name is taken: bad input like the rest
        raise SpecError(source, "name", str(exc)) from None
    store.set(backend=exp.backend, overrides=json.dumps(overrides or {}, sort_keys=True, default=str))
    return execute(store, exp, exp.backend, address, None, display=display, quiet=quiet, source=source)


def load(experiment: str | Path | dict[str, Any], overrides: dict[str, Any] | None = None) -> tuple[Experiment, str, str]:
    """(the validated experiment, its TOML text, a name for it in messages) from a path, TOML text or a dict."""
    import tomllib

    from evo.spec import load_experiment, parse_experiment

    if isinstance(experiment, dict):
        import tomli_w

        try:
            text = tomli_w.dumps(experiment)
        except (TypeError, ValueError) as exc:
            raise SpecError("<dict>", "", f"expected TOML-able values (str, int, float, bool, lists, dicts): {exc}") from None
        return parse_experiment(experiment, "<dict>", overrides), text, "<dict>"
    if isinstance(experiment, Path) or (isinstance(experiment, str) and "\n" not in experiment and "=" not in experiment):
        exp, text = load_experiment(experiment, overrides)
        return exp, text, str(experiment)
    if not isinstance(experiment, str):
        raise SpecError("<experiment>", "", f"expected a path, TOML text or a dict, found {type(experiment).__name__}")
    try:
        data = tomllib.loads(experiment)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError("<toml string>", "", f"malformed TOML: {exc}") from None
    return parse_experiment(data, "<toml string>", overrides), experiment, "<toml string>"


def free_name(runs_dir: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3`... the first that `runs_dir` does not hold."""
    if not (runs_dir / name).exists():
        return name
    n = 2
    while (runs_dir / f"{name}-{n}").exists():
        n += 1
    return f"{name}-{n}"


def execute(store: RunStore, exp: Experiment, backend: str, address: str | None, generations: int | None,
            display: str = "auto", quiet: bool = False, source: str | None = None) -> Run:
    """Run (or continue) the generation loop of an opened run store; closes it. Raises `SpecError`
    for a resource request the backend cannot meet (a run that never started is removed; `source`
    names the experiment in the message), `RunFailed` for a run that failed, `RunInterrupted` (a
    KeyboardInterrupt) when stopped: the run stays resumable."""
    from evo.display import RunDisplay
    from evo.faults import ResourceRequestError
    from evo.loggers import make_loggers
    from evo.observer import ObserverGroup
    from evo.population import evolve, start_backend

    total = generations or exp.population.generations
    view = RunDisplay(store.name, total, exp.population.size, backend,
                      steps_per_generation=exp.population.steps_per_generation, mode=display)
    result = Run(store.path)
    loggers = make_loggers(store, exp)
    scheduler, status = None, "failed"
    store.set(driver=f"{socket.gethostname()}:{os.getpid()}")  # `evo runs` tells a dead driver's run from a live one
    previous_handlers = interrupts.install()  # Ctrl-C and SIGTERM stop a run, resumably
    try:
        with run_log(store.path / LOG_NAME, quiet=quiet, preload=("ray",) if backend == "ray" else ()):
            scheduler, context = start_backend(exp, backend, address)
            with view:
                evolve(exp, store, scheduler, context, total, observer=ObserverGroup([view, *loggers]))
        status = "completed"
    except ResourceRequestError as exc:  # nothing ran: an impossible request is bad input
        source = source or f"{store.path}/experiment"
        discarded = _discard_if_unstarted(store)
        raise SpecError(source, exc.field, str(exc).partition(": ")[2] + (f"; nothing was started, {discarded} removed"
                                                                          if discarded else "")) from None
    except KeyboardInterrupt:
        status = "interrupted"
        store.set(status="interrupted")
        raise RunInterrupted(result) from None
    except Exception as exc:
        store.set(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise RunFailed(result, exc) from exc
    finally:
        interrupts.restore(previous_handlers)
        if scheduler is not None:
            scheduler.close()
        for logger in loggers:
            logger.close(status)
        with contextlib.suppress(Exception):
            store.close()
    return result


def _discard_if_unstarted(store: RunStore) -> Path | None:
    """A run that never saved its founders holds nothing: remove its directory (made a moment ago),
    so no half-made run is listed; returns the path removed. A resumed run is left as it was."""
    if store.population(0):
        return None
    path = store.path
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return path


@contextlib.contextmanager
def run_log(path: Path, quiet: bool = False, preload: tuple[str, ...] = ()) -> Iterator[None]:
    """Within: the `evo.run` lines, Python warnings and the third-party loggers' records also go to
    `path`; with `quiet`, those libraries' console output is switched off (their loggers write only
    to `path`, their progress bars are disabled, warnings are not shown) — errors still surface as
    exceptions. `preload`: modules the run will import (e.g. "ray"), imported first so that the
    console handlers they install at import are replaced too. Everything is put back on exit."""
    if quiet:
        for module in preload:
            with contextlib.suppress(ImportError):
                import_module(module)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    targets = [logging.getLogger(n) for n in ("evo.run", "py.warnings", *THIRD_PARTY_LOGGERS)]
    saved = [(lg, lg.level, lg.propagate) for lg in targets]
    removed: list[tuple[logging.Logger, logging.Handler]] = []
    added: list[tuple[logging.Logger, logging.Handler]] = []
    hf_bars = _transformers_quiet(quiet)
    with environ_restored(QUIET_ENV), warnings.catch_warnings():
        logging.captureWarnings(True)  # warnings become records of `py.warnings`
        try:
            logging.getLogger("evo.run").setLevel(logging.INFO)
            for lg in targets:
                if quiet or lg.name in ("evo.run", "py.warnings"):
                    for h in list(lg.handlers):
                        lg.removeHandler(h)
                        removed.append((lg, h))
                    lg.propagate = False  # not to the root logger's console handler either
                lg.addHandler(handler)
                added.append((lg, handler))
            if quiet:
                os.environ.update(QUIET_ENV)
            else:  # warnings still reach the console, as they would without evo, and run.log too
                added.append((logging.getLogger("py.warnings"), _stderr_handler()))
                added[-1][0].addHandler(added[-1][1])
            yield
        finally:
            logging.captureWarnings(False)
            for lg, h in added:
                lg.removeHandler(h)
            for lg, h in removed:
                lg.addHandler(h)
            for lg, level, propagate in saved:
                lg.setLevel(level)
                lg.propagate = propagate
            if hf_bars is not None:
                hf_bars()
            handler.close()


def _stderr_handler() -> logging.Handler:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(message)s"))
    return h


def _transformers_quiet(quiet: bool) -> Any:
    """Under quiet, switch off transformers' progress bars ("Loading weights"); its logger is set
    up here, so that `run_log` then replaces its console handler. Returns the undo, or None."""
    if not quiet:
        return None
    try:
        from transformers.utils import logging as hf_logging
    except Exception:  # not installed, or broken: nothing of it to silence
        return None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.get_verbosity()  # configures the library's root logger (its stderr handler) now, not mid-run
    hf_logging.disable_progress_bar()

    def undo() -> None:
        if bars:
            hf_logging.enable_progress_bar()
    return undo


# ---- reading a run ----------------------------------------------------------------------------
def open_run(name_or_path: str | Path, runs_dir: str | Path = "runs") -> Run:
    """The run at a path (a directory holding run.sqlite) or named under `runs_dir`.
    Raises `RunStoreError` when there is none."""
    from evo.runstore import RunStore

    store = RunStore.open(name_or_path, runs_dir, read_only=True)
    try:
        return Run(store.path)
    finally:
        store.close()


class Run:
    """A run directory, read through its run store: every method opens it read-only (a run being
    written by another process can be read meanwhile) and returns fresh data."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()

    @contextlib.contextmanager
    def _store(self) -> Iterator[RunStore]:
        from evo.runstore import RunStore

        store = RunStore.open(self.path, read_only=True)
        try:
            yield store
        finally:
            store.close()

    def __repr__(self) -> str:
        try:
            s = self.summary()
        except Exception:
            return f"Run({str(self.path)!r})"
        best = "-" if s["best_score"] is None else f"{s['best_score']:.4g}"
        return f"<Run {s['name']} {s['status']}, {s['generations_done']}/{s['generations']} generations, best {best}>"

    @property
    def name(self) -> str:
        with self._store() as store:
            return store.name

    @property
    def status(self) -> str:
        """created, running, completed, failed or interrupted."""
        with self._store() as store:
            return store.status

    def summary(self) -> dict[str, Any]:
        """Name, status, generations done and planned, best score, agent kind (as `evo runs` lists)."""
        with self._store() as store:
            return store.summary()

    def experiment(self) -> dict[str, Any]:
        """The stored experiment (overrides included), as the run resumes it."""
        with self._store() as store:
            return store.experiment()

    def overrides(self) -> dict[str, Any]:
        """The overrides the run was started with (`--set`, `overrides=`)."""
        with self._store() as store:
            return json.loads(store.get("overrides") or "{}")

    # ---- DataFrames ---------------------------------------------------------------------------
    def leaderboard(self, top: int | None = None) -> pd.DataFrame:
        """The last completed generation's members, elite first: rank, member, score (what selection
        ranked by, the mean of the last `fitness_window` evaluations), score_std, fitness (the
        latest evaluation), evaluations, age, parent, last_mutation, and one column per
        hyperparameter (`hp.NAME`) and architecture knob (`arch.NAME`) — `evo leaderboard`'s rows."""
        import pandas as pd

        from evo.leaderboard import leaderboard_rows

        with self._store() as store:
            rows = leaderboard_rows(store, top)
        return pd.DataFrame([_flat(r, ("hparams", "arch")) for r in rows], columns=None if rows else _LEADERBOARD)

    def evaluations(self) -> pd.DataFrame:
        """Every evaluation of every generation: generation, member, fitness, score, parent, born,
        wall_s, the agent's metrics (`metric.NAME`), training metrics (`train.NAME`), `hp.*`, `arch.*`."""
        import pandas as pd

        from evo.leaderboard import arch_knobs

        with self._store() as store:
            rows = store.all_evaluations()
        out = []
        for r in rows:
            out.append({"generation": r["generation"], "member": r["index"], "fitness": r["fitness"], "score": r["score"],
                        "parent": r["parent"], "born": r["born"], "wall_s": r["wall_s"],
                        **{f"metric.{k}": v for k, v in r["metrics"].items()},
                        **{f"train.{k}": v for k, v in r["train_metrics"].items()},
                        **{f"hp.{k}": v for k, v in r["hparams"].items()},
                        **{f"arch.{k}": v for k, v in arch_knobs(r["arch"]).items()}})
        return pd.DataFrame(out, columns=None if out else ["generation", "member", "fitness", "score", "parent",
                                                           "born", "wall_s"])

    def lineage(self, member: int) -> pd.DataFrame:
        """`member` and its ancestors, newest first: member, parent, born (generation), best_score,
        mutation (a one-line summary of the mutation that made it; empty for a founder), record
        (the mutation's full record). Raises `RunStoreError` for an unknown member."""
        import pandas as pd

        from evo.records import MutationRecord

        with self._store() as store:
            chain = store.lineage(member)
        rows = []
        for m in chain:
            record = MutationRecord.from_json(m["mutation"])
            rows.append({"member": m["index"], "parent": m["parent"], "born": m["born"], "best_score": m["best_score"],
                         "mutation": "" if record is None else record.summary(), "record": m["mutation"]})
        return pd.DataFrame(rows)

    def mutations(self) -> pd.DataFrame:
        """Every child made by mutation: child, parent, generation (the child's first), kind, summary,
        parent_score (the parent's score in the generation before), child_fitness (the child's first
        evaluation; NaN until it has one) and delta = child_fitness - parent_score."""
        import pandas as pd

        from evo.records import MutationRecord

        with self._store() as store:
            members = store.all_members()
            evaluations = store.all_evaluations()
        score = {(e["generation"], e["index"]): e["score"] for e in evaluations}
        fitness = {(e["generation"], e["index"]): e["fitness"] for e in evaluations}
        rows = []
        for m in members:
            if m["parent"] is None:
                continue
            record = MutationRecord.from_json(m["mutation"])
            parent_score = score.get((m["born"] - 1, m["parent"]), float("nan"))
            child = fitness.get((m["born"], m["index"]), float("nan"))
            rows.append({"child": m["index"], "parent": m["parent"], "generation": m["born"],
                         "kind": (m["mutation"] or {}).get("kind", ""), "summary": "" if record is None else record.summary(),
                         "parent_score": parent_score, "child_fitness": child, "delta": child - parent_score})
        return pd.DataFrame(rows, columns=["child", "parent", "generation", "kind", "summary", "parent_score",
                                           "child_fitness", "delta"])

    def diversity(self) -> pd.DataFrame:
        """Per generation, how many trained members were distinct networks: members, distinct,
        mean_distance (mean pairwise parameter distance), identical (groups of bit-identical members)."""
        import pandas as pd

        with self._store() as store:
            history = store.diversity_history()
        return pd.DataFrame([{"generation": g, "members": d.members, "distinct": d.distinct,
                              "mean_distance": d.mean_distance, "identical": d.identical}
                             for g, d in sorted(history.items())],
                            columns=["generation", "members", "distinct", "mean_distance", "identical"])

    # ---- the agents -----------------------------------------------------------------------------
    def elite(self, member: int | None = None, *, generation: int | None = None, best: bool = False) -> Agent:
        """The last generation's elite (or `member`) as a live agent, from its newest kept trained
        checkpoint (or that of `generation`; `best`: the highest-scored checkpoint of the run):
        `run.elite().evaluate().fitness`."""
        from evo.export import load_member

        with self._store() as store:
            return load_member(store, member, generation=generation, best=best)[1]

    def evaluate(self, member: int | None = None, *, generation: int | None = None, best: bool = False,
                 episodes: int | None = None, seed: int | None = None) -> dict[str, Any]:
        """The elite (or `member`, `generation`, `best` as in `elite`) evaluated afresh on held-out
        episodes: `episodes` of them, from `seed` (default: a seed the run did not select on). The
        run's own score of a member is biased up by selection; this is not (`evo.heldout`)."""
        from evo.heldout import evaluate_member

        with self._store() as store:
            return evaluate_member(store, member, generation=generation, best=best, episodes=episodes, seed=seed)

    def export(self, out: str | Path, member: int | None = None, *, best: bool = False) -> Path:
        """Write the elite (or `member`; `best`: the run's highest-scored kept checkpoint) as a
        self-contained directory that `evo.load(out)` rebuilds."""
        from evo.export import export_member

        with self._store() as store:
            _, written = export_member(store, out, member, best=best)
        return written

    # ---- continuing -----------------------------------------------------------------------------
    def resume(self, generations: int | None = None, *, backend: str | None = None, address: str | None = None,
               quiet: bool = False) -> Run:
        """Continue from the last completed generation until `generations` are complete (default:
        the experiment's; more extends the run). A complete run is returned as it is."""
        return resume(self.path, generations=generations, backend=backend, address=address,
                      display="none" if quiet else "auto", quiet=quiet)


def resume(run: str | Path, runs_dir: str | Path = "runs", *, generations: int | None = None,
           backend: str | None = None, address: str | None = None, log: dict[str, str] | None = None,
           display: str = "auto", quiet: bool = False, announce: Any = None) -> Run:
    """What `evo resume` does; `announce(text)` is told what happens first (the command line prints it)."""
    from evo.loggers import check_logging
    from evo.runstore import RunStore

    store = RunStore.open(run, runs_dir)
    try:
        overrides: dict[str, Any] = {"population.generations": generations} if generations else {}
        overrides.update({f"logging.{kind}": directory for kind, directory in (log or {}).items()})
        from evo.spec import parse_experiment

        exp = parse_experiment(store.experiment(), f"{store.path}/experiment", overrides)
        check_logging(exp, f"{store.path}/experiment")
        done = store.last_completed_generation() + 1
        total = exp.population.generations
        # an async run ends after population.size x generations member-rounds (evo.steady), not on generations
        finished = (int(store.get("rounds_done") or 0) >= exp.population.size * total if exp.population.mode == "async"
                    else done >= total)
        stopped = json.loads(store.get("stopped_at_score") or "null")
        if finished or stopped:
            if announce:
                announce(f"run {store.name} stopped: {stop_reason(stopped)}; nothing to resume" if stopped else
                         f"run {store.name} already has {done} of {total} generations; pass --generations N to extend it")
            store.close()
            return Run(store.path)
        chosen = backend or store.get("backend") or exp.backend
        if generations:
            data = store.experiment()
            data["population"]["generations"] = generations
            store.set(experiment=json.dumps(data, sort_keys=True))
        if announce:
            announce(f"resuming {store.name} at generation {done} of {total}")
    except BaseException:
        store.close()
        raise
    return execute(store, exp, chosen, address, total, display=display, quiet=quiet)


_LEADERBOARD = ["rank", "member", "score", "score_std", "fitness", "evaluations", "age", "parent", "last_mutation",
                "generation"]


def stop_reason(stopped: dict[str, Any]) -> str:
    """A run's `stopped_at_score` key for a person: 'member 3 scored 500 in generation 4, reaching
    population.stop_at_score 475'."""
    where = "" if stopped.get("generation") is None else f" in generation {stopped['generation']}"
    return (f"member {stopped['member']} scored {stopped['score']:.4g}{where}, reaching "
            f"population.stop_at_score {stopped['target']:.4g}")


def _flat(row: dict[str, Any], nested: tuple[str, ...]) -> dict[str, Any]:
    """A leaderboard row with its `hparams` and `arch` dicts spread into `hp.NAME` / `arch.NAME` columns."""
    out = {k: v for k, v in row.items() if k not in nested}
    for key, prefix in (("hparams", "hp"), ("arch", "arch")):
        if key in nested:
            out.update({f"{prefix}.{k}": v for k, v in row.get(key, {}).items()})
    return out
