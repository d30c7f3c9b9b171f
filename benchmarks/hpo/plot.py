"""Best evaluated return (or optimality) against total steps (left) and wall time (right): one thin line per
seed, the median over seeds bold."""

from __future__ import annotations

from typing import Any

import numpy as np

COLOURS = {"evo": "tab:red", "random": "tab:grey", "pbt": "tab:blue", "pb2": "tab:cyan", "agilerl": "tab:green"}


def median_curve(curves: list[list[list[float]]], grid: np.ndarray) -> np.ndarray:
    """The median over seeds of each curve's best, held constant between its points (NaN before the first)."""
    values = []
    for curve in curves:
        xs = np.array([p[0] for p in curve], dtype=float)
        ys = np.array([p[2] for p in curve], dtype=float)
        idx = np.searchsorted(xs, grid, side="right") - 1
        values.append(np.where(idx >= 0, ys[np.clip(idx, 0, None)], np.nan))
    return np.nanmedian(np.array(values), axis=0) if values else np.full(grid.shape, np.nan)


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    task = report["task"]
    for column, (ax, label) in enumerate(zip(axes, (f"total {task['unit']} (all members)", "seconds (wall clock)"))):
        x = 0 if column == 0 else 1
        for name, runs in report["strategies"].items():
            curves = [r["curve"] for r in runs if r.get("curve")]
            if not curves:
                continue
            colour = COLOURS.get(name, None)
            for c in curves:
                ax.step([p[x] for p in c], [p[2] for p in c], where="post", color=colour, alpha=0.35, linewidth=1)
            keyed = [[[p[x], p[x], p[2]] for p in c] for c in curves]  # the median over seeds along this axis
            grid = np.unique(np.concatenate([[p[0] for p in c] for c in keyed]))
            ax.step(grid, median_curve(keyed, grid), where="post", color=colour, linewidth=2.8,
                    label=f"{name} (median of {len(curves)})")
        ax.axhline(task["target"], color="black", linestyle="--", linewidth=1, label=f"target {task['target']:g}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("best member's evaluation" + (" (10 episodes)" if task["name"] == "cartpole" else " (optimality)"))
    axes[0].set_title(f"HPO on {task['name']}: best vs budget")
    axes[1].set_title("best vs wall time (this machine, under its load)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
