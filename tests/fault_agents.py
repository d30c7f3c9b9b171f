"""Test-only agents for the fault tests (tests/test_faults*.py): the real ToyAgent with knobs that
make chosen members fail for real.

`[agent.task]` keys besides the ToyAgent's own:
* `explode_lr = [indices]`: those members train with lr 1e12 — the loss really goes to inf/NaN;
* `raise_in = [indices]`: those members' `train` raises a RuntimeError;
* `train_sleep_s`: seconds each `train` call sleeps first (so a test can kill a worker mid-generation);
* `pid_dir`: each `train` call writes its process id to `pid_dir/train-<member>-<pid>` (which process to kill);
* `swallow_interrupt_once`: a path; the first `train` call that finds it missing creates it, sends
  SIGINT to its own process and swallows the KeyboardInterrupt — as library code that catches it does.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.toy_agent import ToyAgent

_EXTRA = {"explode_lr": [], "raise_in": [], "train_sleep_s": 0.0, "pid_dir": "", "swallow_interrupt_once": ""}


class FaultyToyAgent(ToyAgent):
    kind = "tests.fault_agents:FaultyToyAgent"

    @classmethod
    def validate_task(cls, task: dict[str, Any]) -> dict[str, Any]:
        extra = {k: task.get(k, v) for k, v in _EXTRA.items()}
        out = super().validate_task({k: v for k, v in task.items() if k not in _EXTRA})
        return {**out, **extra}

    def _faults(self) -> dict[str, Any]:
        task = self.context.task or {}
        return {k: task.get(k, v) for k, v in _EXTRA.items()}

    def train(self, steps: int) -> dict[str, float]:
        f = self._faults()
        if f["pid_dir"]:
            Path(f["pid_dir"], f"train-{self.index}-{os.getpid()}").write_text(str(time.time()))
        if f["train_sleep_s"]:
            time.sleep(float(f["train_sleep_s"]))
        marker = Path(f["swallow_interrupt_once"]) if f["swallow_interrupt_once"] else None
        if marker is not None and not marker.exists():
            marker.write_text(str(os.getpid()))
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)  # the handler runs here, in this try
            except KeyboardInterrupt:
                pass
        if self.index in f["raise_in"]:
            raise RuntimeError(f"member {self.index} was told to raise")
        if self.index in f["explode_lr"]:
            for group in self.opt.param_groups:
                group["lr"] = 1e12
        return super().train(steps)
