"""Train members on Ray actors: several cores, GPUs or machines.

Members travel as their state (tensors + JSON, the same tree a checkpoint holds), so an actor
can train any member and the result does not depend on which actor ran it. Each actor builds the
run's AgentContext once (the task and the shared replay store handle) and pins torch to
`cpus_per_member` threads; for each member it wraps the store in the member's own view
(evo.replay.view) and ships the view's staged writes back with the result.

Placement (docs/cluster.md): actors are spread over the cluster's nodes (`resources.placement =
"spread"`, Ray's SPREAD strategy) or left to Ray's default, which fills the driver's node first
("default"). An actor with a GPU share trains on the device Ray assigned it: Ray sets
CUDA_VISIBLE_DEVICES to the GPU ids it granted, so the member's device is `cuda:0` *within that
visible set* — four actors with 0.25 each see the same physical GPU as their `cuda:0`. States
travel both ways as CPU tensors: the driver puts each member's start state in the object store
once (a retry reuses it), and an actor moves the trained state to the CPU before returning it.

Prefetch: while more members wait than there are actors, each actor gets a second member queued
behind the one it trains (`prefetch`), whose start state Ray moves to it meanwhile, so it starts
the next member the moment the last one ends instead of waiting for the driver's round trip. A
queued member's timeout starts when the member before it ends; if its actor dies or hangs, it goes
back to the queue without counting as an attempt. Fused jobs are not prefetched.

Warm-up: a fresh actor imports torch and pays its lazy imports (torch._dynamo, sympy: seconds) and,
on a GPU, CUDA's context creation, in `__init__`; the driver dispatches to an actor only after its
`ready()` has answered, so `timeout_s` measures a member's own work, not an actor's start-up.

Faults (docs/faults.md): a member whose actor dies (process killed, node lost) is retried from its
generation-start state on another actor, up to `max_failures` times, and a replacement actor keeps
the pool at `num_workers`; a member that diverges or raises is reported failed (not retried); a
member with no result within `timeout_s` is reported failed and its actor replaced. The driver
waits in slices of at most a second, so Ctrl-C and SIGTERM are handled within seconds.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from evo import interrupts
from evo.agent import Agent, AgentContext
from evo.faults import Failure
from evo.fused.remote import FusedJobs
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.replay.staging import ViewBasis
from evo.replay.view import LineState, commit_views, view_seed
from evo.scheduler.base import (
    MemberResult,
    attempt_member,
    dispatch_order,
    done_event,
    failed_result,
    member_context,
    member_view,
    steps_of_members,
)
from evo.scheduler.cluster import init_ray
from evo.training_thread import prepare_training_thread

__all__ = ["RayScheduler", "init_ray", "PLACEMENTS", "to_cpu"]

PLACEMENTS = {"spread": "SPREAD", "default": "DEFAULT"}  # resources.placement -> Ray scheduling strategy


def to_cpu(tree: Any) -> Any:
    """A state tree with every tensor on the CPU (others untouched): what travels back to the driver."""
    import torch

    if torch.is_tensor(tree):
        return tree.detach().cpu() if tree.device.type != "cpu" else tree
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple
        return type(tree)(*(to_cpu(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree


def member_device(gpu_ids: list[str], cuda_available: bool, default: str) -> str:
    """The device a member actor trains on: with GPUs granted by Ray, the first device of the visible
    set Ray pinned (CUDA_VISIBLE_DEVICES), `cuda:0`; `default` without. Logical GPUs on a machine
    without CUDA (tests, a misdeclared node) give the CPU."""
    if not gpu_ids:
        return default
    return "cuda:0" if cuda_available else "cpu"


def warm_up(device: str) -> None:
    """One tiny Adam step on `device`: loads torch's lazy imports (torch._dynamo, sympy) and, on a GPU,
    creates the CUDA context — the seconds a first member would otherwise pay inside its timeout."""
    import torch

    net = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.zeros(2, 4, device=device)).sum().backward()
    opt.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class _MemberWorker:
    """A Ray actor that trains whichever member it is handed."""

    def __init__(self, agent_class: type[Agent], context: AgentContext, threads: int, warm: bool = True) -> None:
        import os

        import ray
        import torch

        start = time.perf_counter()
        prepare_training_thread(threads)  # threads, allocator, denormals (evo/training_thread.py)
        self.cls = agent_class
        gpu_ids = [str(i) for i in ray.get_gpu_ids()]
        device = member_device(gpu_ids, torch.cuda.is_available(), context.device)
        self.context = replace(context, device=device)
        if warm:
            warm_up(device)
        self.info = {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "gpu_ids": gpu_ids,
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": device,
                     "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                     "warm_up_s": time.perf_counter() - start}

    def ready(self) -> dict[str, Any]:
        """Where this actor runs (node, pid, GPU ids, device) and its start-up seconds; answered once
        `__init__` (the warm-up) is done."""
        return dict(self.info)

    def pid(self) -> int:
        import os

        return os.getpid()

    def run(self, state: dict[str, Any], steps: int, basis: ViewBasis | None,
            seed: np.random.SeedSequence, evaluate: bool = True, line: LineState | None = None) -> dict[str, Any]:
        start = time.perf_counter()
        view = member_view(self.context, basis, seed, line) if basis is not None else None
        agent = self.cls.from_state(state, member_context(self.context, view) if view is not None else self.context)
        load_s = time.perf_counter() - start
        began_at = time.time()
        metrics, evaluation, wall, failure = attempt_member(agent, steps, evaluate=evaluate)
        if failure is not None:  # whatever the attempt staged is dropped with the view
            return {"failure": failure, "wall_s": wall}
        span = (self.info["pid"], began_at, time.time())  # wall clock: the driver lays spans out on its own
        start = time.perf_counter()
        out = to_cpu(agent.get_state())
        return {"failure": None, "state": out, "metrics": metrics, "evaluation": evaluation,
                "wall_s": wall, "staged": view.staged() if view is not None else None,
                "line": view.line_state() if view is not None else None,
                "load_s": load_s, "save_s": time.perf_counter() - start, "node_id": self.info["node_id"], "span": span}

    def run_fused(self, trainer: Any, states: list[Any], steps: int, basis: ViewBasis | None,
                  seeds: list[np.random.SeedSequence]) -> tuple[dict[str, Any], ...]:
        """Several members of one fused group (resources.fused), trained as one program; one result
        per member, each as `run` returns it (the task has one return value per member)."""
        import ray

        from evo.fused.remote import train_members

        self.fused = getattr(self, "fused", None) or trainer  # kept: its groups' tensors serve later jobs
        outs = train_members(self.cls, self.context, self.fused, ray.get(list(states)), steps, basis, seeds, to_cpu)
        return tuple({**out, "node_id": self.info["node_id"]} for out in outs)


class RayScheduler:
    def __init__(self, agent_class: type[Agent], context: AgentContext, num_workers: int,
                 cpus_per_member: float = 1.0, gpus_per_member: float = 0.0, timeout_s: float = 3600.0,
                 max_failures: int = 2, custom_resources: dict[str, float] | None = None,
                 placement: str = "spread", warm: bool = True, start_timeout_s: float = 600.0,
                 fused: Any = None, prefetch: int = 2) -> None:
        """`placement`: "spread" (members' actors over as many nodes as possible) or "default"
        (Ray's default: the driver's node first). `warm`: warm each actor up before its first member.
        `start_timeout_s`: an actor not started and warmed up by then is given up (the cluster has no
        room for it); members left with no actor fail as lost. `prefetch`: members in flight per actor
        (1: none queued; module docstring). `fused`: an `evo.fused.run.FusedTrainer`
        (resources.fused): an actor trains several members of one group as one program (evo.fused.remote)."""
        import ray

        if placement not in PLACEMENTS:
            raise ValueError(f"resources.placement: expected one of {sorted(PLACEMENTS)}, found {placement!r}")
        self.context = context
        self.cls = agent_class
        self.timeout_s = timeout_s
        self.max_failures = max_failures
        self.num_workers = num_workers
        self.gpus_per_member = gpus_per_member
        self.start_timeout_s = start_timeout_s
        self.prefetch = max(1, int(prefetch))
        self.fused = fused
        self._actor = ray.remote(num_cpus=cpus_per_member, num_gpus=gpus_per_member, max_restarts=0,
                                 resources=dict(custom_resources or {}) or None,
                                 scheduling_strategy=PLACEMENTS[placement])(_MemberWorker)
        self._worker_args = (agent_class, context, int(max(1, cpus_per_member)), warm)
        self._ready: dict[Any, Any] = {}  # actor -> its ready() reference, until it has answered
        self.placements: dict[Any, dict[str, Any]] = {}  # actor -> its ready() answer
        self.last_timing: dict[str, Any] = {}  # the last generation's driver-side and worker-side seconds
        # every generation's (actor pid, start of the member's load, end of its evaluation), wall clock
        self.sync_spans: list[tuple[int, float, float]] = []
        self.workers = [self._start() for _ in range(num_workers)]

    def _start(self) -> Any:
        worker = self._actor.remote(*self._worker_args)
        self._ready[worker] = worker.ready.remote()
        return worker

    def _warmed(self, worker: Any, info: dict[str, Any]) -> None:
        self.placements[worker] = info
        if self.gpus_per_member > 0 and info["gpu_ids"] and info["device"] == "cpu":
            warnings.warn(f"Ray gave a member actor GPU {','.join(info['gpu_ids'])} on node {info['node_id'][:12]}, "
                          "but torch sees no CUDA device there: its members train on the CPU", stacklevel=3)

    def worker_info(self) -> list[dict[str, Any]]:
        """Each live actor's ready() answer (node id, pid, GPU ids, CUDA_VISIBLE_DEVICES, device,
        warm-up seconds), waiting for actors still starting."""
        self._await_ready(self.start_timeout_s)
        return [self.placements[w] for w in self.workers]

    def _harvest_ready(self) -> None:
        """Note every actor whose ready() has answered by now (a later generation starts with all of them)."""
        import ray
        from ray.exceptions import RayError

        waiting = {ref: w for w, ref in self._ready.items()}
        if not waiting:
            return
        done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in done:
            try:
                info = ray.get(ref)
            except RayError:  # died starting: the generation loop replaces it when it sees the error
                continue
            del self._ready[waiting[ref]]
            self._warmed(waiting[ref], info)

    def _await_ready(self, timeout: float) -> None:
        """Wait (up to `timeout` s) until every actor has warmed up; raise if one cannot start."""
        import ray

        waiting = {ref: w for w, ref in self._ready.items()}
        if not waiting:
            return
        done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=timeout)
        for ref in done:
            worker = waiting[ref]
            del self._ready[worker]
            self._warmed(worker, ray.get(ref))
        if len(done) < len(waiting):
            raise RuntimeError(f"{len(waiting) - len(done)} member actor(s) not started within {timeout:g} s: "
                               "the cluster has no room for them")

    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        return build_replay(spec, seed, distributed=True)

    def _replace(self, worker: Any) -> Any:
        """Kill `worker` (if it still lives) and start a new actor in its place."""
        self._drop(worker)
        fresh = self._start()
        self.workers.append(fresh)
        return fresh

    def run_generation(self, agents: list[Agent], steps: int | Sequence[int], observer: RunObserver | None = None,
                       generation: int = 0, lines: dict[int, LineState] | None = None,
                       expected_s: Sequence[float | None] | None = None) -> list[MemberResult]:
        """See `Scheduler.run_generation`. With `expected_s`, members start longest first and a member
        queued behind another (`prefetch`) goes to the actor with the fewest expected seconds pending;
        fused jobs keep the input order."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        if lines is not None and self.fused is not None:
            raise ValueError("replay.own_rows = 'line' is not supported with fused groups on the Ray backend "
                             "(resources.fused): use the inline backend or unfused members")
        lines = lines or {}
        per_member = steps_of_members(steps, len(agents), in_step=self.fused is not None)
        order = dispatch_order(expected_s, len(agents))  # validates the hint, fused or not

        began, began_at = time.perf_counter(), time.time()
        observer = observer or RunObserver()
        shared = self.context.replay
        basis = shared.view_basis() if shared is not None else None
        n = len(agents)
        # each member's expected seconds for placing a queued member; an unknown one counts as the longest known
        known = [e for e in expected_s if e is not None] if expected_s is not None else []
        cost = None if expected_s is None else [max(known, default=1.0) if e is None else e for e in expected_s]
        clock = time.perf_counter()
        states = [ray.put(a.get_state()) for a in agents]  # each member's start state, once; kept for retries
        timing = {"put_s": time.perf_counter() - clock, "get_s": 0.0, "rebuild_s": 0.0, "member_s": 0.0,
                  "worker_load_s": 0.0, "worker_save_s": 0.0, "nodes": {}, "spans": {}}
        queue = deque(order if self.fused is None else range(n))
        attempts, retries = [0] * n, [[] for _ in range(n)]
        results: list[MemberResult | None] = [None] * n
        staged = []
        pending: dict[Any, tuple[int, Any, float]] = {}
        self._harvest_ready()
        # actors still starting (the first generation's, replacements): dispatched to once ready() answers
        warming = {self._ready[w]: (w, time.monotonic() + self.start_timeout_s) for w in self.workers if w in self._ready}
        idle = [w for w in self.workers if w not in self._ready]
        failed_starts = 0

        def replace(worker: Any) -> None:
            fresh = self._replace(worker)
            warming[self._ready[fresh]] = (fresh, time.monotonic() + self.start_timeout_s)

        jobs = FusedJobs(self.fused, agents, self.num_workers) if self.fused is not None else None
        gone: set[Any] = set()  # workers of a fused job that died or timed out: replaced once its last member is in
        depth = self.prefetch if jobs is None else 1
        idle[:] = [w for _ in range(depth) for w in idle]  # one entry per free slot: first slots first

        def busy(worker: Any) -> bool:
            return any(w is worker for _, w, _ in pending.values())

        def least_pending(slots: list[Any]) -> int:
            """The slot whose actor has the fewest expected seconds pending; the first such slot on a tie."""
            load = [sum(cost[pos] for pos, w, _ in pending.values() if w is worker) for worker in slots]
            return load.index(min(load))

        def start_queued(worker: Any) -> None:
            """The member queued behind `worker`'s finished one starts now, and so does its timeout."""
            for ref, (pos, w, deadline) in pending.items():
                if w is worker and deadline == math.inf:
                    pending[ref] = (pos, w, time.monotonic() + self.timeout_s)
                    return

        def unqueue(worker: Any) -> None:
            """Members queued behind a dead or hung actor's current one never started: back to the queue."""
            for ref, (pos, w, deadline) in list(pending.items()):
                if w is worker and deadline == math.inf:
                    del pending[ref]
                    attempts[pos] -= 1
                    queue.appendleft(pos)

        def release(worker: Any, dead: bool = False) -> None:
            """A member's result is in: its worker's slot goes back to `idle` (a fused job's worker once
            every member of its job is in), or the worker is replaced once nothing of it is pending, if `dead`."""
            if dead:
                gone.add(worker)
                idle[:] = [w for w in idle if w is not worker]
            else:
                start_queued(worker)
            if busy(worker) and (dead or jobs is not None):
                return
            if worker in gone:
                gone.discard(worker)
                replace(worker)
            else:
                idle.append(worker)

        def lost(pos: int, message: str, at: int = 0) -> bool:
            """`pos` was lost with its worker: back into the queue at `at` (True) or failed, out of retries."""
            index = agents[pos].index
            f = Failure(index, "lost", message, attempts[pos], generation)
            if attempts[pos] <= self.max_failures:
                retries[pos].append(Failure(index, "lost", message, attempts[pos], generation, retried=True))
                queue.insert(at, pos)
                observer.member_event(index, "retried", {"error": f"lost: {message}", "attempt": attempts[pos]})
                return True
            results[pos] = failed_result(agents[pos], f, 0.0, retries[pos])
            observer.member_event(index, "failed", {"error": f"lost: {message}", "kind": "lost"})
            return False

        while queue or pending:
            while queue and idle:
                slot = next((i for i, w in enumerate(idle) if not busy(w)), None)
                if slot is None:  # only second slots: queue a member behind another only while members outnumber actors
                    if len(queue) < len(self.workers):
                        break
                    slot = least_pending(idle) if cost is not None and jobs is None else 0
                worker = idle.pop(slot)
                deadline = math.inf if busy(worker) else None  # queued: its timeout starts when it does
                job = jobs.take(queue) if jobs is not None else [queue.popleft()]  # a fused job: several members
                seeds = [view_seed(self.context.seed, agents[pos].index, generation) for pos in job]
                refs = ([worker.run.remote(states[job[0]], per_member[job[0]], basis, seeds[0], True,
                                           lines.get(agents[job[0]].index))] if len(job) == 1 else
                        worker.run_fused.options(num_returns=len(job)).remote(self.fused, [states[p] for p in job],
                                                                               per_member[job[0]], basis, seeds))
                for pos, ref in zip(job, refs):  # each member of a job has its own result: faults stay per member
                    attempts[pos] += 1
                    pending[ref] = (pos, worker, deadline or time.monotonic() + self.timeout_s * len(job))
                    # a member given no steps only evaluates (selection.rest_elite): the display says so
                    observer.member_event(agents[pos].index, "training" if per_member[pos] else "evaluating", {})
            if not pending and not warming:  # members left and no actor to run them: the cluster lost its room
                while queue:
                    pos = queue.popleft()
                    f = Failure(agents[pos].index, "lost", f"no member actor could be started within {self.start_timeout_s:g} s "
                                "after workers were lost", max(1, attempts[pos]), generation)
                    results[pos] = failed_result(agents[pos], f, 0.0, retries[pos])
                    observer.member_event(f.index, "failed", {"error": f"lost: {f.message}", "kind": "lost"})
                break
            interrupts.check()  # a Ctrl-C that Ray's blocking call swallowed stops the run here
            now = time.monotonic()
            deadlines = [d for _, _, d in pending.values()] + [d for _, d in warming.values()]
            wait = min(1.0, max(0.0, min(deadlines) - now))
            ready, _ = ray.wait(list(pending) + list(warming), num_returns=1, timeout=wait)
            if not ready:
                for ref, (worker, deadline) in list(warming.items()):
                    if time.monotonic() >= deadline:  # no room for it: give up on this actor
                        del warming[ref]
                        self._drop(worker)
                for ref, (pos, worker, deadline) in list(pending.items()):
                    if time.monotonic() >= deadline and ref in pending:
                        del pending[ref]
                        unqueue(worker)
                        release(worker, dead=True)
                        f = Failure(agents[pos].index, "timeout", f"no result within {self.timeout_s:g} s "
                                    "(resources.timeout_s); its worker was replaced", attempts[pos], generation)
                        results[pos] = failed_result(agents[pos], f, self.timeout_s, retries[pos])
                        observer.member_event(f.index, "failed", {"error": f"timeout: {f.message}", "kind": "timeout"})
                continue
            ref = ready[0]
            if ref in warming:
                worker, _ = warming.pop(ref)
                try:
                    info = ray.get(ref)
                except RayError:  # died while starting (its node lost too?): another, a bounded number of times
                    failed_starts += 1
                    if failed_starts <= self.num_workers * (self.max_failures + 1):
                        replace(worker)
                    else:
                        self._drop(worker)
                    continue
                del self._ready[worker]
                self._warmed(worker, info)
                idle.extend([worker] * depth)
                continue
            pos, worker, deadline = pending.pop(ref)
            clock = time.perf_counter()
            try:
                out = ray.get(ref)
            except RayTaskError as exc:  # the wrapper itself raised (e.g. a state from_state refuses)
                release(worker)
                f = Failure(agents[pos].index, "error", _first_line(exc), attempts[pos], generation)
                results[pos] = failed_result(agents[pos], f, 0.0, retries[pos])
                observer.member_event(f.index, "failed", {"error": f"error: {f.message}", "kind": "error"})
                continue
            except RayError as exc:  # the actor's process or node is gone: replace it, retry the member
                # and the rest of its fused job with it, at once: read one by one, the first member back
                # could be retried alone on an idle actor before its job-mates' errors were read
                started = [] if deadline == math.inf else [pos]
                for r, (p, w, d) in list(pending.items()):
                    if w is worker and d != math.inf:
                        del pending[r]
                        started.append(p)
                unqueue(worker)
                release(worker, dead=True)
                if deadline == math.inf:  # it was queued, never started: not an attempt
                    attempts[pos] -= 1
                    queue.appendleft(pos)
                at = 0
                for p in sorted(started):  # in generation order at the queue's front: retried as one job again
                    at += lost(p, f"{type(exc).__name__}: {_first_line(exc)}", at)
                continue
            timing["get_s"] += time.perf_counter() - clock
            release(worker)
            index = agents[pos].index
            if out["failure"] is not None:
                kind, message = out["failure"]
                if kind == "lost":
                    lost(pos, message)
                    continue
                f = Failure(index, kind, message, attempts[pos], generation)
                results[pos] = failed_result(agents[pos], f, out["wall_s"], retries[pos])
                observer.member_event(index, "failed", {"error": f"{kind}: {message}", "kind": kind})
                continue
            clock = time.perf_counter()
            agent = self.cls.from_state(out["state"], self.context)
            timing["rebuild_s"] += time.perf_counter() - clock
            timing["member_s"] += out["wall_s"]
            timing["worker_load_s"] += out["load_s"]
            timing["worker_save_s"] += out["save_s"]
            timing["nodes"][index] = out["node_id"]
            if out.get("span") is not None:  # (actor pid, train start, evaluate end): time.time() on its node
                timing["spans"][index] = out["span"]
                pid, span_start, span_end = out["span"]
                self.sync_spans.append((pid, span_start - out.get("load_s", 0.0), span_end))
            agent.index = index
            results[pos] = MemberResult(agent, out["evaluation"], out["metrics"], out["wall_s"], None, retries[pos],
                                        out.get("line"))
            if out["staged"] is not None:
                staged.append((index, out["staged"]))
            observer.member_event(index, "done", done_event(out["evaluation"], out["wall_s"], per_member[pos]))
        clock = time.perf_counter()
        if shared is not None:
            commit_views(shared, staged)
        timing["commit_s"] = time.perf_counter() - clock
        timing["began_at"], timing["ended_at"] = began_at, time.time()
        timing["state_transfer_s"] = timing["put_s"] + timing["get_s"] + timing["rebuild_s"]
        timing["wall_s"] = time.perf_counter() - began
        self.last_timing = timing
        return [r for r in results if r is not None]

    # ---- asynchronous evolution (population.mode = "async"; evo.steady) ------------------------------
    @property
    def capacity(self) -> int:
        """Members in flight at once: `prefetch` per actor (one training, the next queued behind it,
        whose start state Ray moves meanwhile: the actor starts it the moment the last one ends)."""
        return self.num_workers * self.prefetch

    def submit(self, key: Any, agent: Agent, steps: int, round_: int, observer: RunObserver | None = None,
               evaluate: bool = True) -> None:
        """Start a round of `steps` for `agent` (evaluated after it unless `evaluate=False`) on the
        least busy actor (or as soon as one is free); `collect` returns its result under `key`. The
        member's view of the shared replay store is taken now, and its writes reach the store as
        soon as its result is collected."""
        import ray

        if not hasattr(self, "_async_pending"):
            self._async_pending: dict[Any, dict[str, Any]] = {}
            self._async_queue: deque[dict[str, Any]] = deque()
            self.async_spans: list[tuple[int, float, float]] = []  # (actor pid, round start, round end), wall clock
        shared = self.context.replay
        self._async_queue.append({
            "key": key, "agent": agent, "steps": steps, "round": round_, "state": ray.put(agent.get_state()),
            "basis": shared.view_basis() if shared is not None else None, "attempts": 0, "retries": [],
            "evaluate": evaluate, "observer": observer or RunObserver()})
        self._async_dispatch()

    def in_flight(self) -> int:
        return len(getattr(self, "_async_pending", {})) + len(getattr(self, "_async_queue", ()))

    def _async_dispatch(self) -> None:
        while self._async_queue:
            load = {id(w): 0 for w in self.workers if w not in self._ready}
            for j in self._async_pending.values():
                if id(j["worker"]) in load:
                    load[id(j["worker"])] += 1
            free = [w for w in self.workers if id(w) in load and load[id(w)] < self.prefetch]
            if not free:
                return
            worker = min(free, key=lambda w: load[id(w)])
            job = self._async_queue.popleft()
            job["attempts"] += 1
            # a job queued behind another has that one's time too before its own timeout runs out
            job["worker"], job["deadline"] = worker, time.monotonic() + self.timeout_s * (load[id(worker)] + 1)
            seed = view_seed(self.context.seed, job["agent"].index, job["round"])
            self._async_pending[worker.run.remote(job["state"], job["steps"], job["basis"], seed,
                                                     job["evaluate"])] = job
            job["observer"].member_event(job["agent"].index, "training", {})

    def collect(self, timeout: float | None = 1.0) -> list[tuple[Any, MemberResult]]:
        """The results that are in (waiting up to `timeout` s for one): (key, result) pairs. A member
        whose actor died is retried on a fresh actor (up to `max_failures` times) before it is
        reported lost; one with no result within `timeout_s` is reported failed and its actor replaced."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        if not hasattr(self, "_async_pending"):
            return []
        self._async_dispatch()
        warming = {ref: w for w, ref in self._ready.items()}
        refs = list(self._async_pending) + list(warming)
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out: list[tuple[Any, MemberResult]] = []
        for ref in ready:
            if ref in warming:
                worker = warming[ref]
                try:
                    info = ray.get(ref)
                except RayError:  # died starting: another in its place
                    self._replace(worker)
                    continue
                del self._ready[worker]
                self._warmed(worker, info)
                continue
            job = self._async_pending.pop(ref)
            index, worker, observer = job["agent"].index, job["worker"], job["observer"]
            try:
                res = ray.get(ref)
            except RayTaskError as exc:
                f = Failure(index, "error", _first_line(exc), job["attempts"], job["round"])
                out.append((job["key"], failed_result(job["agent"], f, 0.0, job["retries"])))
                observer.member_event(index, "failed", {"error": f"error: {f.message}", "kind": "error"})
                continue
            except RayError as exc:  # the actor is gone: a fresh one (once per actor), and the member again
                if worker in self.workers:
                    self._replace(worker)
                self._async_lost(job, f"{type(exc).__name__}: {_first_line(exc)}", out)
                continue
            if res["failure"] is not None:
                kind, message = res["failure"]
                if kind == "lost":
                    self._async_lost(job, message, out)
                    continue
                f = Failure(index, kind, message, job["attempts"], job["round"])
                out.append((job["key"], failed_result(job["agent"], f, res["wall_s"], job["retries"])))
                observer.member_event(index, "failed", {"error": f"{kind}: {message}", "kind": kind})
                continue
            agent = self.cls.from_state(res["state"], self.context)
            agent.index = index
            if res["staged"] is not None:
                commit_views(self.context.replay, [(index, res["staged"])])
            if res.get("span") is not None:  # busy from the state's load on: the actor was not idle then
                pid, began, ended = res["span"]
                self.async_spans.append((pid, began - res.get("load_s", 0.0), ended))
            out.append((job["key"], MemberResult(agent, res["evaluation"], res["metrics"], res["wall_s"], None,
                                                 job["retries"])))
            observer.member_event(index, "done", done_event(res["evaluation"], res["wall_s"], job["steps"]))
        now = time.monotonic()
        for ref, job in list(self._async_pending.items()):
            if now >= job["deadline"]:
                del self._async_pending[ref]
                if job["worker"] in self.workers:
                    self._replace(job["worker"])
                f = Failure(job["agent"].index, "timeout", f"no result within {self.timeout_s:g} s "
                            "(resources.timeout_s); its worker was replaced", job["attempts"], job["round"])
                out.append((job["key"], failed_result(job["agent"], f, self.timeout_s, job["retries"])))
                job["observer"].member_event(f.index, "failed", {"error": f"timeout: {f.message}", "kind": "timeout"})
        self._async_dispatch()
        return out

    def _async_lost(self, job: dict[str, Any], message: str, out: list[tuple[Any, MemberResult]]) -> None:
        """A member lost with its actor: queued again at the front, or failed once out of retries."""
        index = job["agent"].index
        if job["attempts"] <= self.max_failures:
            job["retries"].append(Failure(index, "lost", message, job["attempts"], job["round"], retried=True))
            self._async_queue.appendleft(job)
            job["observer"].member_event(index, "retried", {"error": f"lost: {message}", "attempt": job["attempts"]})
            return
        f = Failure(index, "lost", message, job["attempts"], job["round"])
        out.append((job["key"], failed_result(job["agent"], f, 0.0, job["retries"])))
        job["observer"].member_event(index, "failed", {"error": f"lost: {message}", "kind": "lost"})

    def _drop(self, worker: Any) -> None:
        """Kill `worker` and forget it, starting none in its place."""
        import ray

        try:
            ray.kill(worker, no_restart=True)
        except Exception:  # already gone
            pass
        if worker in self.workers:
            self.workers.remove(worker)
        self._ready.pop(worker, None)
        self.placements.pop(worker, None)

    def worker_pids(self) -> list[int]:
        """Process ids of the live member actors (tests kill them)."""
        import ray

        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already gone
                pass
        self.workers = []
        stop = getattr(self.context.replay, "stop", None)  # the run's replay service: ours to stop
        if stop is not None:
            try:
                stop()
            except Exception:
                pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."
