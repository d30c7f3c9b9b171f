"""Run the in-process replay tests on both code paths: the optional numba kernels and the pure-numpy
fallback (``EVO_REPLAY_NUMBA=0`` forces the fallback for a whole run, Ray actors included)."""

from __future__ import annotations

import pytest

from evo.replay import _kernels

PATHS = ["numba", "numpy"] if _kernels.AVAILABLE else ["numpy"]
# These spawn processes (Ray actors, kill -9 subprocesses) that use their own process default, or
# (test_kernels.py) switch paths themselves.
_OWN_PROCESS = {"test_service.py", "test_snapshot.py", "test_kernels.py", "test_sharded.py"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.path.name not in _OWN_PROCESS:
        metafunc.fixturenames.append("kernel_path")
        metafunc.parametrize("kernel_path", PATHS, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the Ray backend of the contract suite runs in the actor's process: one run of it is enough
    def dup(it: pytest.Item) -> bool:
        p = getattr(it, "callspec", None)
        return (len(PATHS) > 1 and p is not None and p.params.get("make") in ("ray", "sharded-ray")
                and p.params.get("kernel_path") == "numpy")

    keep = [it for it in items if not dup(it)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep


@pytest.fixture
def kernel_path(request):
    prev = _kernels.set_enabled(request.param == "numba")
    yield request.param
    _kernels.set_enabled(prev)
