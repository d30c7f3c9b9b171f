"""Report a run to the tools people already use: TensorBoard and MLflow, as `RunObserver`s.

Enabled by the experiment's `[logging]` table or `evo run --log tensorboard|mlflow DIR`; each
needs its extra (`evo[tensorboard]`, `evo[mlflow]`). Both log after a generation commits (from the
rows the run store just wrote), so what they show is exactly what the leaderboard shows.

TensorBoard, under DIR/<run>/:
  population/      best_score, median_fitness, best_fitness, size per generation
  member_NNNNN/    score, fitness, eval/<metric>, train/<metric>, hparams/<name> per generation;
                   for the final population also HParams-plugin data (its hyperparameters and
                   architecture against score and fitness)
MLflow: one parent run named after the run (the experiment's settings as params; population
metrics per generation; the elite's export as the artifact `elite/`), a nested run per member
(its hyperparameters and architecture as params, its metrics per generation).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from evo.observer import RunObserver
from evo.records import MutationRecord
from evo.runstore import RunStore

__all__ = ["RunLogger", "TensorBoardLogger", "MLflowLogger", "make_loggers", "check_logging"]

_EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}


def check_logging(exp: Any, source: str = "experiment") -> None:
    """Refuse (before a run directory exists) a `[logging]` target whose library is not installed."""
    import importlib.util

    from evo.spec import SpecError

    for kind, (module, extra) in _EXTRAS.items():
        if getattr(exp.logging, kind) and importlib.util.find_spec(module) is None:
            raise SpecError(source, f"logging.{kind}",
                            f"needs the {module!r} package: pip install 'evo[{extra}]' (or -e '.[{extra}]')")


def make_loggers(store: RunStore, exp: Any) -> list[RunLogger]:
    """The loggers the experiment's `[logging]` table asks for."""
    out: list[RunLogger] = []
    if exp.logging.tensorboard:
        out.append(TensorBoardLogger(exp.logging.tensorboard, store.name))
    if exp.logging.mlflow:
        out.append(MLflowLogger(exp.logging.mlflow, store, exp))
    return out


class RunLogger(RunObserver):
    def close(self, status: str) -> None:
        """The run stopped with `status` ("completed", "interrupted" or "failed"); flush and finish."""


def _numbers(prefix: str, values: dict[str, Any]) -> dict[str, float]:
    """Numeric entries as `prefix/name` (bools and strings are not plottable scalars)."""
    return {f"{prefix}/{k}": float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _plain(value: Any) -> Any:
    """A value TensorBoard's HParams and MLflow's params accept (lists become their text)."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def _arch_knobs(arch: dict[str, Any]) -> dict[str, Any]:
    """The architecture without its mutation bounds (min_*, max_*, node_step)."""
    return {k: v for k, v in arch.items() if not k.startswith(("min_", "max_")) and k != "node_step"}


def _population_metrics(board: list[dict[str, Any]]) -> dict[str, float]:
    fitness = [r["fitness"] for r in board if not math.isnan(r["fitness"])]
    return {"best_score": float(board[0]["score"]), "best_fitness": max(fitness, default=math.nan),
            "median_fitness": statistics.median(fitness) if fitness else math.nan, "size": float(len(board))}


class TensorBoardLogger(RunLogger):
    def __init__(self, directory: str | Path, run: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.root = Path(directory) / run
        self._writer = SummaryWriter
        self.population = SummaryWriter(str(self.root / "population"))
        self.members: dict[int, Any] = {}
        self.last_board: list[dict[str, Any]] = []

    def _member(self, index: int) -> Any:
        if index not in self.members:
            self.members[index] = self._writer(str(self.root / f"member_{index:05d}"))
        return self.members[index]

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        if not board:
            return
        for tag, value in _population_metrics(board).items():
            self.population.add_scalar(tag, value, generation)
        for row in board:
            writer = self._member(row["index"])
            scalars = {"score": row["score"], "fitness": row["fitness"], **_numbers("eval", row["metrics"]),
                       **_numbers("train", row["train_metrics"]), **_numbers("hparams", row["hparams"])}
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, generation)
        alive = {row["index"] for row in board}
        for index in [i for i in self.members if i not in alive]:  # a member that left never returns
            self.members.pop(index).close()
        self.population.flush()
        self.last_board = board

    def close(self, status: str) -> None:
        from torch.utils.tensorboard.summary import hparams

        for row in self.last_board:  # HParams plugin: the final population, one session per member
            params = {**{k: _plain(v) for k, v in row["hparams"].items()},
                      **{f"arch.{k}": _plain(v) for k, v in _arch_knobs(row["arch"]).items()}}
            writer = self._member(row["index"])
            for summary in hparams(params, {"score": row["score"], "fitness": row["fitness"]}):
                writer.file_writer.add_summary(summary)
        for writer in [self.population, *self.members.values()]:
            writer.close()
        self.members = {}


class MLflowLogger(RunLogger):
    def __init__(self, target: str, store: RunStore, exp: Any) -> None:
        from mlflow.tracking import MlflowClient

        if "://" in target or target.startswith("file:"):
            uri = target
        else:
            uri = Path(target).resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the plain-directory store in maintenance mode behind this opt-in; a
            # directory that needs no server is what a local run wants
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.store, self.uri = store, uri
        found = self.client.get_experiment_by_name(exp.name)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(exp.name)
        self.parent = self._find_parent() or self._create_parent(exp)
        self.member_runs = self._find_members()

    def _find_parent(self) -> str | None:
        """The run's parent MLflow run, if an earlier `evo run` (before `evo resume`) made one."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`evo.run` = '{self.store.name}' "
                                                                           "and tags.`evo.role` = 'run'")
        return runs[0].info.run_id if runs else None

    def _create_parent(self, exp: Any) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id, run_name=self.store.name,
                                     tags={"evo.run": self.store.name, "evo.role": "run", "evo.agent": exp.spec.agent.kind,
                                           "evo.run_dir": str(self.store.path)})
        spec = exp.to_json()
        params = {"seed": spec["seed"], "backend": spec["backend"], "agent.kind": spec["agent"]["kind"],
                  **{f"{table}.{k}": v for table in ("population", "selection", "mutation")
                     for k, v in spec[table].items()}}
        self.client.log_batch(run.info.run_id, params=[Param(k, str(_plain(v))) for k, v in params.items()])
        return run.info.run_id

    def _find_members(self) -> dict[int, str]:
        """Member runs an earlier `evo run` made (a resumed run goes on logging into them)."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{self.parent}'")
        return {int(r.data.tags["evo.member"]): r.info.run_id for r in runs if "evo.member" in r.data.tags}

    def _member(self, row: dict[str, Any]) -> str:
        from mlflow.entities import Param

        index = row["index"]
        if index not in self.member_runs:
            record = MutationRecord.from_json(row["mutation"])
            tags = {"mlflow.parentRunId": self.parent, "evo.run": self.store.name, "evo.member": str(index),
                    "evo.born": str(row["born"]), "evo.parent": "" if row["parent"] is None else str(row["parent"]),
                    "evo.mutation": "founder" if record is None else record.summary()}
            run = self.client.create_run(self.experiment_id, run_name=f"member {index}", tags=tags)
            # a member's hyperparameters and architecture never change (a mutation makes a new member)
            params = {**row["hparams"], **{f"arch.{k}": v for k, v in _arch_knobs(row["arch"]).items()}}
            self.client.log_batch(run.info.run_id, params=[Param(k, str(_plain(v))) for k, v in params.items()])
            self.member_runs[index] = run.info.run_id
        return self.member_runs[index]

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        if not board:
            return
        now = int(time.time() * 1000)
        self.client.log_batch(self.parent, metrics=[Metric(k, v, now, generation)
                                                    for k, v in _population_metrics(board).items()])
        for row in board:
            values = {"score": row["score"], "fitness": row["fitness"], **_numbers("eval", row["metrics"]),
                      **_numbers("train", row["train_metrics"])}
            self.client.log_batch(self._member(row), metrics=[Metric(k, float(v), now, generation)
                                                              for k, v in values.items()])
        alive = {row["index"] for row in board}
        for index in [i for i in self.member_runs if i not in alive]:
            self.client.set_terminated(self.member_runs.pop(index), "FINISHED")

    def close(self, status: str) -> None:
        from evo.export import export_member

        mlflow_status = {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        for run_id in self.member_runs.values():
            self.client.set_terminated(run_id, mlflow_status)
        self.member_runs = {}
        if self.store.last_completed_generation() >= 0:
            with tempfile.TemporaryDirectory(prefix="evo-elite-") as tmp:
                try:
                    row, out = export_member(self.store, Path(tmp) / "elite")
                except Exception as exc:  # an export the agent refuses must not lose the run's metrics
                    self.client.set_tag(self.parent, "evo.export_error", f"{type(exc).__name__}: {exc}")
                else:
                    self.client.log_artifacts(self.parent, str(out), artifact_path="elite")
                    self.client.set_tag(self.parent, "evo.elite", str(row["index"]))
        self.client.set_terminated(self.parent, mlflow_status)
