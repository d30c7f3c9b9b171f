"""Checking an experiment's resource request against the Ray cluster before the first generation.

A member actor needs `cpus_per_member` CPUs, `gpus_per_member` GPUs and its `custom_resources`, all
on one node. Ray keeps an actor whose request no node can meet pending forever (a GPU actor on a
CPU-only machine never starts), so the run would sit until `timeout_s`. Here an impossible request
fails at once with a `ResourceRequestError` naming the field, what was asked and what the cluster
offers; `resources.wait_for_resources_s` lets an autoscaling cluster take that long to grow first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from evo.faults import ResourceRequestError

__all__ = ["member_request", "plan_workers", "check_cluster", "local_machine"]

_EPS = 1e-9


def member_request(res: Any) -> dict[str, float]:
    """Ray resources one member actor asks for."""
    req = {"CPU": float(res.cpus_per_member)}
    if res.gpus_per_member > 0:
        req["GPU"] = float(res.gpus_per_member)
    req.update({k: float(v) for k, v in res.custom_resources.items()})
    return req


def _field(name: str) -> str:
    return {"CPU": "resources.cpus_per_member", "GPU": "resources.gpus_per_member"}.get(
        name, f"resources.custom_resources.{name}")


def _fmt(x: float) -> str:
    return f"{x:g}"


def plan_workers(res: Any, population_size: int, nodes: list[dict[str, float]]) -> int:
    """How many member actors to start on a cluster whose alive nodes have `nodes` resources;
    raises `ResourceRequestError` if the request cannot be met."""
    req = member_request(res)
    if not nodes:
        raise ResourceRequestError("resources", "a Ray node to run members on", "no alive node")
    for name, amount in req.items():
        best = max(n.get(name, 0.0) for n in nodes)
        if best + _EPS < amount:
            total = sum(n.get(name, 0.0) for n in nodes)
            offered = (f"no {name} at all" if total == 0 else
                       f"at most {_fmt(best)} {name} on any one node ({_fmt(total)} in total over {len(nodes)} node"
                       f"{'s' if len(nodes) != 1 else ''})")
            raise ResourceRequestError(_field(name), f"{_fmt(amount)} {name} per member", offered,
                                       "an actor's resources must all be on one node")
    fits = [min(math.floor(n.get(k, 0.0) / v + _EPS) for k, v in req.items()) for n in nodes]
    room = sum(fits)
    if room == 0:
        raise ResourceRequestError("resources", " + ".join(f"{_fmt(v)} {k}" for k, v in req.items()) + " on one node",
                                   "no node with all of them together")
    if res.num_workers is not None:
        if res.num_workers > room:
            raise ResourceRequestError(
                "resources.num_workers", f"{res.num_workers} workers of " + " + ".join(f"{_fmt(v)} {k}" for k, v in req.items()),
                f"room for {room} at once", "lower num_workers, or leave it out to use as many as fit")
        return int(res.num_workers)
    return max(1, min(population_size, room))


def local_machine() -> list[dict[str, float]] | None:
    """What a local Ray cluster started here would offer, when that is certain without starting it:
    this machine's CPUs and no GPU and no custom resource — known only when there is no sign of a
    GPU (no CUDA device for torch, no nvidia-smi). None when a GPU may be there (Ray decides then)."""
    import os
    import shutil

    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:
        cuda = False
    if cuda or shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
        return None
    return [{"CPU": float(os.cpu_count() or 1)}]


def alive_nodes() -> list[dict[str, float]]:
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def check_cluster(res: Any, population_size: int, nodes: Callable[[], list[dict[str, float]]] = alive_nodes,
                  sleep: Callable[[float], None] = time.sleep) -> int:
    """`plan_workers` against the live cluster, retried for up to `res.wait_for_resources_s` (an
    autoscaling cluster grows on demand); returns the number of workers to start."""
    deadline = time.monotonic() + float(res.wait_for_resources_s)
    while True:
        try:
            return plan_workers(res, population_size, nodes())
        except ResourceRequestError as exc:
            if time.monotonic() >= deadline:
                if res.wait_for_resources_s > 0:
                    raise ResourceRequestError(exc.field, exc.asked, f"{exc.offered} after waiting "
                                               f"{res.wait_for_resources_s:g} s (resources.wait_for_resources_s)") from None
                raise ResourceRequestError(exc.field, exc.asked, exc.offered,
                                           "an autoscaling cluster may be given resources.wait_for_resources_s to grow") from None
            sleep(min(2.0, max(0.0, deadline - time.monotonic())))
