"""EfficientZero members share one replay store; a run killed while the run store snapshots it resumes
to exactly the uninterrupted run.

The run is the golden tiny experiment (tests/golden/record.py), with the golden runs' CPU kernels
pinned, so "the uninterrupted run" is the recorded table: every evaluation, hyperparameter and
architecture, hence the same elite, and the loss metrics (to the recording's 1%).
On Ray the store is a replay actor that sends its arrays to the driver, which writes the files (the
same window, reached through the object store); the Ray backend gives the inline leaderboard
(tests/test_faults_ray.py), so the same golden table is the reference.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from evo.replay.snapshot import list_snapshots
from evo.runstore import RunStore
from tests.conftest import run_evo
from tests.golden.record import PINNED_CPU_ENV, differences, evaluation_table, golden_path, recorded_on_this_cpu, tiny_experiment

NAME = "cartpole_efficientzero"


@pytest.mark.parametrize("backend", ["inline", pytest.param("ray", marks=pytest.mark.slow)])
def test_killed_mid_replay_snapshot_resumes_to_the_uninterrupted_run(backend: str, tmp_path: Path) -> None:
    tiny_experiment(NAME, tmp_path)
    killed = run_evo(["run", f"{NAME}.toml", "--backend", backend], tmp_path,
                     env={**PINNED_CPU_ENV, "EVO_FAULT": "during_replay_snapshot:1"}, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = tmp_path / "runs" / NAME
    # the window was hit: generation 1's snapshot is debris, generation 0's is whole and committed
    debris = [p.name for p in (run_dir / "replay" / "g0001").iterdir()]
    assert debris and all(n.startswith(".tmp-") for n in debris), debris
    assert [ok for _, _, ok in list_snapshots(run_dir / "replay" / "g0000")] == [True]
    store = RunStore.open(run_dir)
    assert store.last_completed_generation() == 0
    store.close()

    run_evo(["resume", NAME, "--backend", backend], tmp_path, env=PINNED_CPU_ENV, check=True, timeout=600)
    store = RunStore.open(run_dir)
    try:
        assert differences(json.loads(golden_path(NAME).read_text()), evaluation_table(store),
                           same_cpu=recorded_on_this_cpu(NAME)) == []
    finally:
        store.close()
