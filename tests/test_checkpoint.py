import json

import numpy as np
import pytest
import torch

from evo.checkpoint import CheckpointError, load_state, save_state


def _state():
    return {"w": torch.randn(3, 4), "nested": {"a": [torch.arange(5), 1.5, "x"], "n": np.arange(4, dtype=np.int32)},
            "rng": {"torch": torch.Generator().manual_seed(1).get_state()}, "big": 2**100, "none": None}


def test_round_trip(tmp_path) -> None:
    state = _state()
    digest = save_state(tmp_path / "c", state, meta={"generation": 3})
    loaded, meta = load_state(tmp_path / "c", expect_digest=digest)
    assert meta == {"generation": 3}
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["nested"]["a"][0], torch.arange(5))
    assert loaded["nested"]["a"][1:] == [1.5, "x"] and loaded["big"] == 2**100 and loaded["none"] is None
    assert isinstance(loaded["nested"]["n"], np.ndarray) and loaded["nested"]["n"].dtype == np.int32


def test_truncated_tensor_file_is_refused(tmp_path) -> None:
    save_state(tmp_path / "c", _state())
    f = tmp_path / "c" / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated or altered"):
        load_state(tmp_path / "c")


def test_altered_tensor_byte_is_refused(tmp_path) -> None:
    save_state(tmp_path / "c", _state())
    f = tmp_path / "c" / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or altered"):
        load_state(tmp_path / "c")


def test_altered_json_is_refused(tmp_path) -> None:
    save_state(tmp_path / "c", {"lr": 0.1, "w": torch.ones(2)})
    f = tmp_path / "c" / "state.json"
    doc = json.loads(f.read_text())
    doc["body"]["state"]["lr"] = 0.2
    f.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="contents altered"):
        load_state(tmp_path / "c")


def test_truncated_json_and_missing_files_are_refused(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    f = tmp_path / "c" / "state.json"
    f.write_text(f.read_text()[:20])
    with pytest.raises(CheckpointError, match="not a readable evo checkpoint"):
        load_state(tmp_path / "c")
    with pytest.raises(CheckpointError, match="missing"):
        load_state(tmp_path / "nowhere")


def test_digest_mismatch_with_run_store_record(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    with pytest.raises(CheckpointError, match="not the one the run store recorded"):
        load_state(tmp_path / "c", expect_digest="0" * 64)


def test_unstorable_values_are_refused_at_save(tmp_path) -> None:
    with pytest.raises(TypeError, match="cannot store a object"):
        save_state(tmp_path / "c", {"x": object()})


def test_loading_never_unpickles(tmp_path, monkeypatch) -> None:
    import pickle

    save_state(tmp_path / "c", _state())

    def boom(*a, **k):
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(torch, "load", boom)
    load_state(tmp_path / "c")
