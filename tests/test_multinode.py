"""Several Ray nodes on one machine (`ray.cluster_utils.Cluster`): placement, GPU shares, the run
directory on the driver only, and a node lost mid-generation (docs/cluster.md).

The cluster: a head node with no CPU (so no member can run beside the driver), node A with 2 CPUs
and one *logical* GPU, node B with 2 CPUs. Every worker process of the job refuses writes under
this module's runs directory (tests/driver_only.py), so a run that completes there was written by
the driver alone. The module starts its own cluster (it cannot share the session-style
`ray_cluster` fixture, which is a one-node local Ray): it shuts down any Ray left initialised by an
earlier module first, and its own cluster after its last test. The node-loss test removes a node,
so it runs last. Default run: the write guard and the spread run (~20 s with the cluster's start);
the GPU packing and node-loss tests are `slow` (each starts more actors: ~20 s).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tomllib

from evo.observer import RunObserver
from evo.population import evolve, start_backend
from evo.runstore import RunStore
from evo.spec import parse_experiment
from tests.conftest import REPO, TOY_EXPERIMENT
from tests.driver_only import DRIVER_ONLY_ENV

ray = pytest.importorskip("ray")


class _Cluster:
    def __init__(self, runs: Path) -> None:
        from ray.cluster_utils import Cluster

        self.runs = runs
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": 100 * 1024**2})
        # Cluster() records its address in /tmp/ray/ray_current_cluster "for convenience": every plain
        # ray.init() on this machine would then join it (or refuse num_cpus). Forget it: we pass the address
        ray._common.utils.reset_ray_address()
        self.node_a = self.cluster.add_node(num_cpus=2, num_gpus=1, object_store_memory=80 * 1024**2)
        self.node_b = self.cluster.add_node(num_cpus=2, object_store_memory=80 * 1024**2)
        self.cluster.wait_for_nodes()
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               DRIVER_ONLY_ENV: str(runs)}
        ray.init(address=self.cluster.address, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": env, "worker_process_setup_hook": "tests.driver_only.install"})

    @property
    def address(self) -> str:
        return self.cluster.address

    def worker_nodes(self) -> dict[str, Any]:
        """node id -> Node object, for the worker nodes still in the cluster."""
        return {n.node_id: n for n in self.cluster.worker_nodes}

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    if ray.is_initialized():  # an earlier module's Ray: this module needs a driver on its own cluster
        ray.shutdown()
    c = _Cluster(tmp_path_factory.mktemp("driver_only_runs"))
    yield c
    c.shutdown()


def toy_experiment(name: str, resources: dict[str, Any], task: dict[str, Any] | None = None,
                   generations: int = 2) -> tuple[Any, str]:
    """The toy experiment (tests/experiments/toy.toml) with FaultyToyAgent, on Ray, with `resources`."""
    text = TOY_EXPERIMENT.read_text()
    data = tomllib.loads(text)
    data.update(name=name, backend="ray")
    data["agent"] = {**data["agent"], "kind": "tests.fault_agents:FaultyToyAgent",
                     "task": {**data["agent"]["task"], **(task or {})}}
    data["population"] = {**data["population"], "generations": generations}
    data["resources"] = {**data["resources"], "timeout_s": 120, **resources}
    return parse_experiment(data, f"<{name}>"), text


def run(c: _Cluster, name: str, exp: Any, text: str, observer: RunObserver | None = None) -> tuple[RunStore, Any]:
    """Evolve `exp` on the cluster into a run under the driver-only runs directory."""
    store = RunStore.create(c.runs, name, text, exp.to_json())
    scheduler, context = start_backend(exp, "ray", c.address)
    try:
        evolve(exp, store, scheduler, context, observer=observer)
    finally:
        scheduler.close()
    return store, scheduler


def checkpoints_of_last_generation(store: RunStore) -> list[Path]:
    """The trained checkpoints the run store lists for its last generation (older ones are pruned
    to each generation's best), each checked to be a non-empty directory of the run."""
    dirs = [store.path / row["checkpoint"] for row in store.evaluations() if row["checkpoint"]]
    assert all(d.is_dir() and any(d.iterdir()) for d in dirs), dirs
    return dirs


@ray.remote(num_cpus=1)
def _try_to_write(path: str) -> str:
    try:
        Path(path).write_text("a worker was here")
    except PermissionError:
        return "refused"
    return "written"


def test_worker_processes_on_every_node_cannot_write_the_runs_directory(cluster: _Cluster) -> None:
    """The guard the next tests rely on: a task on each worker node is refused a write there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for node_id in cluster.worker_nodes():
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        target = cluster.runs / f"probe-{node_id[:8]}"
        assert ray.get(_try_to_write.options(scheduling_strategy=strategy).remote(str(target)), timeout=120) == "refused"
        assert not target.exists()


def test_members_spread_over_nodes_and_only_the_driver_writes_the_run(cluster: _Cluster) -> None:
    # members sleep 0.3 s in train: long enough that both actors get members in generation 1. A 3 s
    # timeout: fresh actors take longer than that to start (torch import, warm-up), which must not count
    exp, text = toy_experiment("spread", {"num_workers": 2, "cpus_per_member": 1, "placement": "spread",
                                          "timeout_s": 3.0}, task={"train_sleep_s": 0.3})
    store, scheduler = run(cluster, "spread", exp, text)
    placed = {info["node_id"] for info in scheduler.placements.values()}
    assert placed == set(cluster.worker_nodes()), placed  # one actor on each worker node
    assert set(scheduler.last_timing["nodes"].values()) == placed  # and both trained members
    assert store.last_completed_generation() == 1
    # a worker writing under the runs directory would have failed its member, as would a timeout
    assert store.failures() == [], [i["warm_up_s"] for i in scheduler.placements.values()]
    for generation in (0, 1):
        assert len(store.evaluations(generation)) == exp.population.size
    assert len(checkpoints_of_last_generation(store)) == exp.population.size
    assert sorted(p.name for p in cluster.runs.iterdir()) == ["spread"]  # no probe or stray file from a worker


@pytest.mark.slow
def test_quarter_gpu_members_pack_four_on_one_logical_gpu(cluster: _Cluster) -> None:
    """gpus_per_member = 0.25: the four actors that fit all sit on node A's one (logical) GPU, each
    sees it as its only visible device, and a generation trains there. With a 1 s timeout: actor
    start-up (torch import, warm-up) is outside it, so no member times out."""
    import torch

    from evo.agent import AgentContext

    exp, _ = toy_experiment("quarter", {"num_workers": None, "cpus_per_member": 0.5, "gpus_per_member": 0.25,
                                        "timeout_s": 1.0})
    scheduler, context = start_backend(exp, "ray", cluster.address)
    try:
        assert len(scheduler.workers) == 4  # room: node A min(2 / 0.5, 1 / 0.25) = 4, node B has no GPU
        cuda = torch.cuda.is_available()
        if cuda:
            infos = scheduler.worker_info()
        else:
            with pytest.warns(UserWarning, match="torch sees no CUDA device"):
                infos = scheduler.worker_info()
        node_a = cluster.node_a.node_id
        assert [i["node_id"] for i in infos] == [node_a] * 4
        assert [i["gpu_ids"] for i in infos] == [["0"]] * 4
        assert [i["cuda_visible_devices"] for i in infos] == ["0"] * 4  # set by Ray, per actor
        assert [i["device"] for i in infos] == ["cuda:0" if cuda else "cpu"] * 4
        assert len({i["pid"] for i in infos}) == 4
        assert ray.available_resources().get("GPU", 0.0) == pytest.approx(0.0)  # 4 × 0.25: the GPU is full
        agents = [exp.agent_class.create(exp.arch, {k: v.value for k, v in exp.hparam_space.items()}, i, i,
                                         AgentContext(task=exp.task)) for i in range(4)]
        results = scheduler.run_generation(agents, 10)
        assert [r.failure for r in results] == [None] * 4, [i["warm_up_s"] for i in infos]
        assert set(scheduler.last_timing["nodes"].values()) == {node_a}
    finally:
        scheduler.close()


def test_a_prefetched_member_s_timeout_starts_when_it_does(cluster: _Cluster) -> None:
    """One actor, two members of 2 s each, timeout 3.5 s: the second is queued behind the first at
    once (prefetch), and would time out if its clock started then; it starts when the first ends."""
    from evo.agent import AgentContext

    exp, _ = toy_experiment("prefetch", {"num_workers": 1, "cpus_per_member": 1, "timeout_s": 3.5},
                            task={"train_sleep_s": 2.0})
    scheduler, context = start_backend(exp, "ray", cluster.address)
    try:
        assert scheduler.prefetch == 2
        agents = [exp.agent_class.create(exp.arch, {k: v.value for k, v in exp.hparam_space.items()}, i, i,
                                         AgentContext(task=exp.task)) for i in range(2)]
        results = scheduler.run_generation(agents, 5)
    finally:
        scheduler.close()
    assert [r.failure for r in results] == [None, None]
    (pid, _, first_end), (pid2, second_start, _) = (scheduler.last_timing["spans"][i] for i in (0, 1))
    assert pid == pid2 and second_start >= first_end


class _RemoveANodeMidTraining(RunObserver):
    """When generation 0's members are training, remove the worker node running one of them."""

    def __init__(self, c: _Cluster, delay_s: float) -> None:
        self.c, self.delay_s = c, delay_s
        self.scheduler: Any = None
        self.removed: str | None = None
        self.thread: threading.Thread | None = None

    def member_event(self, index: int, event: str, data: dict[str, Any]) -> None:
        if event == "training" and self.thread is None:
            self.thread = threading.Thread(target=self._remove, daemon=True)
            self.thread.start()

    def _remove(self) -> None:
        time.sleep(self.delay_s)
        node_id = next(iter(self.scheduler.placements.values()))["node_id"]
        self.removed = node_id
        self.c.cluster.remove_node(self.c.worker_nodes()[node_id])


@pytest.mark.slow
def test_a_node_lost_mid_generation_is_survived(cluster: _Cluster) -> None:
    """Runs last: it removes a node. Members on the lost node are retried from their generation-start
    state on a replacement actor; every generation completes with every member evaluated once."""
    exp, text = toy_experiment("lost", {"num_workers": 2, "cpus_per_member": 1, "max_failures": 2},
                               task={"train_sleep_s": 1.5})
    store = RunStore.create(cluster.runs, "lost", text, exp.to_json())
    scheduler, context = start_backend(exp, "ray", cluster.address)
    remover = _RemoveANodeMidTraining(cluster, delay_s=0.5)
    remover.scheduler = scheduler
    try:
        scheduler.worker_info()  # both actors up before the first dispatch, so the node goes mid-training
        evolve(exp, store, scheduler, context, observer=remover)
    finally:
        scheduler.close()
    assert remover.removed is not None and remover.removed not in cluster.worker_nodes()
    failures = store.failures()
    assert failures and all(f.kind == "lost" and f.retried and f.generation == 0 for f in failures), failures
    assert store.last_completed_generation() == 1
    for generation in (0, 1):
        assert len(store.evaluations(generation)) == exp.population.size
    assert len(checkpoints_of_last_generation(store)) == exp.population.size
    assert remover.removed not in set(scheduler.last_timing["nodes"].values())  # generation 1 ran on the rest
