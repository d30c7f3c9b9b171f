"""benchmarks.efficientzero: --arch trains the agent with those keys over its default network and records them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import efficientzero as bench


def test_arch_keys_change_the_agents_network_and_are_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              one_torch_thread: None) -> None:
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["efficientzero", "--max-env-steps", "16", "--eval-every", "16", "--arch", "width=32",
                                      "--arch", "blocks=[32, 16]", "--json", str(out)])
    bench.main()
    result = json.loads(out.read_text())
    assert result["arch_overrides"] == {"width": 32, "blocks": [32, 16]}
    assert (result["arch"]["width"], result["arch"]["blocks"], result["arch"]["latent_size"]) == (32, [32, 16], 64)
    assert result["env_steps"] == 16 and len(result["curve"]) == 1


def test_an_unknown_arch_key_is_refused_before_training(monkeypatch: pytest.MonkeyPatch, one_torch_thread: None) -> None:
    monkeypatch.setattr(sys, "argv", ["efficientzero", "--arch", "depth=3"])
    with pytest.raises(ValueError, match="arch.depth: unknown architecture key"):
        bench.main()
