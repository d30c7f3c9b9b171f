"""What each dashboard view shows, computed from a run store opened read-only.

Every function takes a `RunStore` (opened with `read_only=True`, so a running `evo run` is never
blocked) and returns plain JSON-able data; the page draws it. Nothing here writes anywhere.

Words as in the engine: a member's *fitness* is one evaluation, its *score* the windowed mean
that selection ranks by.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from evo.leaderboard import arch_knobs, compact, leaderboard_rows, varying_keys
from evo.records import MutationRecord
from evo.runstore import DB_NAME, RunStore

__all__ = ["RunsDir", "RUN_NAME", "run_summary", "leaderboard", "fitness", "lineage", "schedule", "parallel",
           "mutation_effects", "member_detail", "version"]

# what a run directory may be called here: evo's own run names (letters, digits, _ . -, no leading dot)
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class RunsDir:
    """The one directory the dashboard reads: run names resolve to run directories directly inside it,
    never through a symbolic link and never outside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def run_path(self, name: str) -> Path | None:
        """The run directory for `name`, or None if `name` is not a valid run of this directory."""
        if not RUN_NAME.fullmatch(name) or ".." in name:
            return None
        path = self.root / name
        if path.is_symlink() or (path / DB_NAME).is_symlink():
            return None
        if not (path / DB_NAME).is_file() or path.resolve().parent != self.root:
            return None
        return path

    def open(self, name: str) -> RunStore | None:
        path = self.run_path(name)
        return None if path is None else RunStore(path, read_only=True)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name for p in sorted(self.root.iterdir()) if self.run_path(p.name) is not None]


def _finite(x: Any) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _summary(record: dict[str, Any] | None) -> str:
    r = MutationRecord.from_json(record)
    return "founder" if r is None else r.summary()


def _roots(members: list[dict[str, Any]]) -> dict[int, int]:
    """Each member's founder (the root of its lineage)."""
    parent = {m["index"]: m["parent"] for m in members}
    roots: dict[int, int] = {}
    for index in parent:
        chain, current = [], index
        while current is not None and current not in roots and current not in chain:
            chain.append(current)
            current = parent.get(current)
        root = roots.get(current, chain[-1]) if current is not None else chain[-1]
        for c in chain:
            roots[c] = root
    return roots


def _diversity(store: RunStore) -> dict[int, Any]:
    """Per-generation diversity, where this version of the run store measures it."""
    reader = getattr(store, "diversity_history", None)
    return reader() if callable(reader) else {}


def _failures(store: RunStore) -> dict[int, int] | None:
    """Failed attempts per member, where the run store records failures (None: it does not)."""
    reader = getattr(store, "failures", None)
    if not callable(reader):
        return None
    counts: dict[int, int] = defaultdict(int)
    for f in reader():
        index = f.get("index", f.get("idx")) if isinstance(f, dict) else getattr(f, "index", None)
        if index is not None:
            counts[int(index)] += 1
    return dict(counts)


def run_summary(store: RunStore) -> dict[str, Any]:
    """The runs view's row: status, generations done / planned, best score, started, agent."""
    s = store.summary()
    planned = store.get("generations_planned")
    div = _diversity(store).get(store.last_completed_generation())
    return _clean({
        **s, "generations": int(planned) if planned else s["generations"], "backend": store.get("backend"),
        "error": store.get("error"), "population": store.experiment().get("population", {}).get("size"),
        "diversity": None if div is None else {"distinct": div.distinct, "members": div.members},
    })


def version(store: RunStore) -> dict[str, Any]:
    """What changes when the run makes progress: the page polls this and redraws only on a change."""
    return {"generations_done": store.last_completed_generation() + 1, "status": store.status,
            "updated_at": store.get("updated_at")}


def leaderboard(store: RunStore) -> dict[str, Any]:
    """The last completed generation, elite first, with each member's score and fitness history;
    `varying_hparams` / `varying_arch` name what differs between members (shown by default)."""
    rows = leaderboard_rows(store)
    scores: dict[int, list[list[float | None]]] = defaultdict(list)
    for ev in store.all_evaluations():
        scores[ev["index"]].append([ev["generation"], _finite(ev["score"])])
    history = {ev["index"]: ev["history"] for ev in store.evaluations()}
    failures = _failures(store)
    out = []
    for r in rows:
        out.append({**r, "arch_text": " ".join(f"{k}={compact(v)}" for k, v in r["arch"].items()),
                    "fitness_history": history.get(r["member"], []), "score_history": scores.get(r["member"], []),
                    "failures": None if failures is None else failures.get(r["member"], 0)})
    return _clean({"generation": store.last_completed_generation(), "status": store.status, "rows": out,
                   "varying_hparams": varying_keys([r["hparams"] for r in rows]),
                   "varying_arch": varying_keys([r["arch"] for r in rows]),
                   "has_failures": failures is not None})


def fitness(store: RunStore) -> dict[str, Any]:
    """Every evaluation as a point (coloured by lineage), the best score and median fitness per
    generation, and the population's diversity where it was measured."""
    evals = store.all_evaluations()
    roots = _roots(store.all_members())
    by_generation: dict[int, list[float]] = defaultdict(list)
    for ev in evals:
        if _finite(ev["fitness"]) is not None:
            by_generation[ev["generation"]].append(ev["fitness"])
    gens = store.all_generations()
    div = _diversity(store)
    return _clean({
        "points": [{"generation": ev["generation"], "member": ev["index"], "fitness": ev["fitness"], "score": ev["score"],
                    "lineage": roots.get(ev["index"], ev["index"])} for ev in evals],
        "generations": [{"generation": g["generation"], "best_score": g["best_score"], "best_member": g["best_index"],
                         "median_fitness": statistics.median(by_generation[g["generation"]])
                         if by_generation[g["generation"]] else None, "wall_s": g["wall_s"]} for g in gens],
        "diversity": [{"generation": g, "distinct": d.distinct, "members": d.members, "mean_distance": d.mean_distance}
                      for g, d in sorted(div.items())],
    })


def lineage(store: RunStore) -> dict[str, Any]:
    """Who cloned whom: one node per member (placed at the generation it was born, rows ordered so
    that every lineage is contiguous) and one edge per clone, carrying the mutation."""
    members = store.all_members()
    evals = store.all_evaluations()
    last_gen: dict[int, int] = {}
    best: dict[int, float] = {}
    for ev in evals:
        last_gen[ev["index"]] = max(last_gen.get(ev["index"], -1), ev["generation"])
        if _finite(ev["score"]) is not None:
            best[ev["index"]] = max(best.get(ev["index"], -math.inf), ev["score"])
    children: dict[int | None, list[int]] = defaultdict(list)
    known = {m["index"] for m in members}
    for m in members:
        children[m["parent"] if m["parent"] in known else None].append(m["index"])
    row: dict[int, int] = {}
    stack = sorted(children[None], reverse=True)
    while stack:  # depth-first, so each member's descendants sit right below it
        index = stack.pop()
        row[index] = len(row)
        stack.extend(sorted(children.get(index, []), reverse=True))
    roots = _roots(members)
    final = store.last_completed_generation()
    alive = {ev["index"] for ev in store.evaluations(final)} if final >= 0 else set()
    nodes, edges = [], []
    for m in members:
        record = MutationRecord.from_json(m["mutation"])
        nodes.append({"member": m["index"], "parent": m["parent"], "born": m["born"], "row": row.get(m["index"], 0),
                      "last_generation": last_gen.get(m["index"]), "best_score": best.get(m["index"]),
                      "lineage": roots.get(m["index"], m["index"]), "alive": m["index"] in alive,
                      "mutation": _summary(m["mutation"])})
        if m["parent"] in row:
            edges.append({"parent": m["parent"], "child": m["index"], "generation": m["born"],
                          "kind": record.kind if record else "?", "op": record.op if record else "?",
                          "summary": _summary(m["mutation"])})
    elite = store.evaluations(final)[0]["index"] if alive else None
    return _clean({"nodes": nodes, "edges": edges, "elite": elite, "generations_done": final + 1})


def _hparam_scales(store: RunStore) -> dict[str, str]:
    """Each hyperparameter's scale ("log" or "linear") as the experiment declares it, where the
    agent class can be imported here; {} otherwise (the page then picks linear axes)."""
    from evo.spec import parse_experiment

    try:
        exp = parse_experiment(store.experiment(), f"{store.path}/experiment")
    except Exception:  # the agent's package is not importable where the dashboard runs
        return {}
    return {name: hp.scale for name, hp in exp.hparam_space.items()}


def schedule(store: RunStore) -> dict[str, Any]:
    """The elite's ancestry as a PBT-style schedule: for every generation, the ancestor that was
    training then and its hyperparameters, with a marker where a mutation handed over to a child."""
    final = store.last_completed_generation()
    if final < 0:
        return {"elite": None, "generations": [], "hparams": {}, "switches": []}
    elite = store.evaluations(final)[0]["index"]
    chain = list(reversed(store.lineage(elite)))  # founder first
    evals = {(ev["generation"], ev["index"]): ev for ev in store.all_evaluations()}
    points = []
    for g in range(final + 1):
        ancestor = [m for m in chain if m["born"] <= g]
        if not ancestor:
            continue
        member = ancestor[-1]["index"]
        ev = evals.get((g, member))
        if ev is not None:
            points.append({"generation": g, "member": member, "hparams": ev["hparams"], "score": ev["score"],
                           "fitness": ev["fitness"]})
    all_rows = [ev["hparams"] for ev in evals.values()]
    names = [k for k in varying_keys(all_rows) if any(isinstance(p["hparams"].get(k), (int, float)) for p in points)]
    if not names and points:  # nothing varies anywhere: show the elite's numeric settings as flat lines
        names = [k for k, v in points[-1]["hparams"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    switches = [{"generation": m["born"], "member": m["index"], "parent": m["parent"], "mutation": _summary(m["mutation"])}
                for m in chain if m["parent"] is not None]
    scales = _hparam_scales(store)
    return _clean({
        "elite": elite, "chain": [m["index"] for m in chain], "generations": [p["generation"] for p in points],
        "members": [p["member"] for p in points], "scores": [p["score"] for p in points],
        "hparams": {k: [p["hparams"].get(k) for p in points] for k in names},
        "log_scale": [k for k in names if scales.get(k) == "log"], "switches": switches,
    })


def parallel(store: RunStore) -> dict[str, Any]:
    """Hyperparameters against score: one line per member, at its latest evaluation."""
    latest: dict[int, dict[str, Any]] = {}
    for ev in store.all_evaluations():
        latest[ev["index"]] = ev  # rows come by generation, so the last one seen is the latest
    rows = list(latest.values())
    names = varying_keys([r["hparams"] for r in rows]) or (list(rows[0]["hparams"]) if rows else [])
    dims = []
    for name in names:
        values = [r["hparams"].get(name) for r in rows]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dims.append({"label": name, "values": values})
        else:  # a categorical hyperparameter: positions with the category names as ticks
            cats = sorted({str(v) for v in values})
            dims.append({"label": name, "values": [cats.index(str(v)) for v in values], "ticktext": cats,
                         "tickvals": list(range(len(cats)))})
    return _clean({"members": [r["index"] for r in rows], "generations": [r["generation"] for r in rows],
                   "score": [r["score"] for r in rows], "fitness": [r["fitness"] for r in rows], "dimensions": dims})


def mutation_effects(store: RunStore) -> dict[str, Any]:
    """For every child: its first fitness minus its parent's fitness in the generation it was cloned
    from, by mutation kind (and architecture operation). The `no_mutation` children are the control:
    their change is what one more generation of training alone gives."""
    evals = {(ev["generation"], ev["index"]): ev for ev in store.all_evaluations()}
    effects = []
    for m in store.all_members():
        record = MutationRecord.from_json(m["mutation"])
        if m["parent"] is None or record is None:
            continue
        before, after = evals.get((m["born"] - 1, m["parent"])), evals.get((m["born"], m["index"]))
        if before is None or after is None:
            continue
        delta = _finite(after["fitness"] - before["fitness"]) if _finite(after["fitness"]) is not None and \
            _finite(before["fitness"]) is not None else None
        group = record.kind if record.kind != "architecture" else f"architecture: {record.op}"
        effects.append({"child": m["index"], "parent": m["parent"], "generation": m["born"], "kind": record.kind,
                        "op": record.op, "group": group, "summary": record.summary(),
                        "function_preserving": record.function_preserving,
                        "parent_fitness": before["fitness"], "child_fitness": after["fitness"], "delta": delta})
    groups: dict[str, list[float]] = defaultdict(list)
    for e in effects:
        if e["delta"] is not None:
            groups[e["group"]].append(e["delta"])
    table = [{"group": g, "count": len(d), "mean": statistics.fmean(d), "median": statistics.median(d),
              "improved": sum(1 for x in d if x > 0) / len(d)} for g, d in sorted(groups.items())]
    return _clean({"effects": effects, "groups": table})


def member_detail(store: RunStore, index: int) -> dict[str, Any] | None:
    """One member: identity, ancestry, children, and per generation its fitness, score, evaluation
    and training metrics, hyperparameters, architecture and checkpoint digest."""
    m = store.member(index)
    if m is None:
        return None
    evals = [ev for ev in store.all_evaluations() if ev["index"] == index]
    chain = store.lineage(index)
    kids = [c for c in store.all_members() if c["parent"] == index]
    exportable = any(ev["checkpoint"] for ev in evals)
    return _clean({
        "member": index, "parent": m["parent"], "born": m["born"], "mutation": m["mutation"],
        "mutation_summary": _summary(m["mutation"]),
        "ancestry": [{"member": a["index"], "born": a["born"], "best_score": a["best_score"],
                      "mutation": _summary(a["mutation"])} for a in chain],
        "children": [{"member": c["index"], "born": c["born"], "mutation": _summary(c["mutation"])} for c in kids],
        "evaluations": [{"generation": ev["generation"], "fitness": ev["fitness"], "score": ev["score"],
                         "metrics": ev["metrics"], "train_metrics": ev["train_metrics"], "wall_s": ev["wall_s"],
                         "checkpoint": ev["checkpoint"], "digest": ev["digest"], "hparams": ev["hparams"],
                         "arch": arch_knobs(ev["arch"])} for ev in evals],
        "exportable": exportable,
    })
