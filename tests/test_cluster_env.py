"""A local cluster started by `init_ray` hands its processes the driver's code path and owner tag
through the environment it inherits (no runtime_env), and leaves the driver's own environment as it was;
it is a cluster of its own even where another one (`ray start`) left its address for plain ray.init()."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray")

SCRIPT = r"""
import json, os, sys
before = {k: os.environ.get(k) for k in ("PYTHONPATH", "EVO_RAY_OWNER")}
from evo.scheduler.cluster import init_ray, started_local_cluster
init_ray(num_cpus=1)
import ray

@ray.remote(num_cpus=0)
def probe():
    import os
    import local_module  # only importable from the driver's working directory
    return {"owner": os.environ.get("EVO_RAY_OWNER"), "value": local_module.VALUE}

out = ray.get(probe.remote())
out["tag"] = started_local_cluster()
out["driver_env_kept"] = before == {k: os.environ.get(k) for k in ("PYTHONPATH", "EVO_RAY_OWNER")}
print("RESULT", json.dumps(out))
ray.shutdown()
"""


def test_a_local_cluster_sees_the_drivers_directory_and_tag_and_the_driver_env_is_kept(tmp_path: Path) -> None:
    """The driver runs as a script from elsewhere (as `evo run` does, from .venv/bin): a worker still imports
    from the driver's working directory (init_ray puts it on PYTHONPATH; Ray also carries the driver's path)."""
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "local_module.py").write_text("VALUE = 42\n")
    (scripts / "driver.py").write_text(SCRIPT)
    repo = Path(__file__).resolve().parents[1]
    # Ray's temp directory of this test alone (short: Ray's socket paths must fit in 107 bytes), where a
    # cluster started by `ray start` left its address: a plain ray.init() would join it, or fail trying
    ray_tmp = Path(tempfile.mkdtemp(prefix="evo-rt-", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9\n")  # nothing listens there
    env = {**os.environ, "PYTHONPATH": str(repo), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
           "RAY_TMPDIR": str(ray_tmp)}
    env.pop("EVO_RAY_OWNER", None)
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run([sys.executable, str(scripts / "driver.py")], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["value"] == 42
    assert out["tag"] and out["owner"] == out["tag"]
    assert out["driver_env_kept"]
