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


def _rewrite_body(directory, edit) -> None:
    """Edit a checkpoint's JSON body and re-sign it, as a writer of another format would."""
    import hashlib

    f = directory / "state.json"
    doc = json.loads(f.read_text())
    edit(doc["body"])
    doc["sha256"] = hashlib.sha256(json.dumps(doc["body"], sort_keys=True).encode()).hexdigest()
    f.write_text(json.dumps(doc))


def test_the_digest_returned_is_the_one_recorded_and_accepted(tmp_path) -> None:
    digest = save_state(tmp_path / "c", {"w": torch.ones(2)})
    doc = json.loads((tmp_path / "c" / "state.json").read_text())
    assert doc["sha256"] == digest and len(digest) == 64
    assert doc["body"]["format"] == "evo-checkpoint/1" and doc["body"]["meta"] == {}
    state, meta = load_state(tmp_path / "c", expect_digest=digest)
    assert meta == {} and torch.equal(state["w"], torch.ones(2))


def test_the_same_state_gives_the_same_digest_and_another_state_another(tmp_path) -> None:
    a = save_state(tmp_path / "a", {"w": torch.ones(2), "lr": 0.1})
    b = save_state(tmp_path / "b", {"lr": 0.1, "w": torch.ones(2)})
    c = save_state(tmp_path / "c", {"w": torch.ones(2), "lr": 0.2})
    assert a == b != c


def test_scalars_tuples_and_numpy_scalars_come_back_as_json(tmp_path) -> None:
    state = {"t": (1, 2.5, "x"), "i": np.int64(7), "f": np.float32(0.5), "b": True, "deep": [[{"k": None}]]}
    save_state(tmp_path / "c", state)
    loaded, _ = load_state(tmp_path / "c")
    assert loaded == {"t": [1, 2.5, "x"], "i": 7, "f": 0.5, "b": True, "deep": [[{"k": None}]]}
    assert type(loaded["i"]) is int and type(loaded["f"]) is float and loaded["b"] is True


def test_a_state_without_tensors_round_trips(tmp_path) -> None:
    digest = save_state(tmp_path / "c", {"lr": 0.1}, meta={"m": 1})
    assert load_state(tmp_path / "c", expect_digest=digest) == ({"lr": 0.1}, {"m": 1})


def test_a_bare_tensor_or_array_is_a_state(tmp_path) -> None:
    save_state(tmp_path / "t", torch.arange(3))
    assert torch.equal(load_state(tmp_path / "t")[0], torch.arange(3))
    save_state(tmp_path / "a", np.arange(3.0))
    np.testing.assert_array_equal(load_state(tmp_path / "a")[0], np.arange(3.0))


def test_tensors_are_saved_detached_contiguous_and_on_cpu(tmp_path) -> None:
    w = torch.randn(4, 3, requires_grad=True)
    save_state(tmp_path / "c", {"wt": w.t(), "grad": w * 2})
    loaded, _ = load_state(tmp_path / "c")
    assert torch.equal(loaded["wt"], w.t().detach()) and not loaded["grad"].requires_grad
    assert torch.equal(loaded["grad"], (w * 2).detach())


def test_a_saved_array_is_a_copy(tmp_path) -> None:
    arr = np.arange(4)
    save_state(tmp_path / "c", {"a": arr})
    arr[0] = 99
    assert load_state(tmp_path / "c")[0]["a"].tolist() == [0, 1, 2, 3]


def test_a_dict_that_only_looks_like_a_reference_stays_a_dict(tmp_path) -> None:
    state = {"user": {"__tensor__": "w", "extra": 1}, "w": torch.ones(1)}
    save_state(tmp_path / "c", state)
    loaded, _ = load_state(tmp_path / "c")
    assert loaded["user"] == {"__tensor__": "w", "extra": 1}


def test_non_string_keys_are_refused_with_their_path(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"^state key 3 at opt\.groups\.0: expected str keys$"):
        save_state(tmp_path / "c", {"opt": {"groups": [{3: 1.0}]}})
    with pytest.raises(TypeError, match="^state value at w.1: cannot store a set "):
        save_state(tmp_path / "c", {"w": [1, {2}]})
    with pytest.raises(TypeError, match="^state value at <root>: cannot store a object"):
        save_state(tmp_path / "c", object())


def test_an_unknown_format_is_refused(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    _rewrite_body(tmp_path / "c", lambda body: body.update(format="evo-checkpoint/99"))
    with pytest.raises(CheckpointError, match="format 'evo-checkpoint/99', expected 'evo-checkpoint/1'"):
        load_state(tmp_path / "c")


def test_unreadable_tensor_data_with_a_matching_digest_is_refused(tmp_path) -> None:
    import hashlib

    save_state(tmp_path / "c", {"w": torch.ones(2)})
    junk = b"not safetensors at all"
    (tmp_path / "c" / "tensors.safetensors").write_bytes(junk)
    _rewrite_body(tmp_path / "c", lambda body: body.update(tensors_sha256=hashlib.sha256(junk).hexdigest()))
    with pytest.raises(CheckpointError, match="unreadable safetensors data"):
        load_state(tmp_path / "c")


def test_a_skeleton_without_its_fields_is_refused(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    (tmp_path / "c" / "state.json").write_text(json.dumps({"body": {}}))
    with pytest.raises(CheckpointError, match="not a readable evo checkpoint"):
        load_state(tmp_path / "c")


def test_a_missing_tensor_file_is_named(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    (tmp_path / "c" / "tensors.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"tensors\.safetensors: checkpoint file missing"):
        load_state(tmp_path / "c")


def test_saving_again_replaces_the_checkpoint_and_leaves_no_temporary_files(tmp_path) -> None:
    save_state(tmp_path / "c", {"w": torch.ones(2)})
    digest = save_state(tmp_path / "c", {"w": torch.zeros(3)})
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["state.json", "tensors.safetensors"]
    assert torch.equal(load_state(tmp_path / "c", expect_digest=digest)[0]["w"], torch.zeros(3))


def test_a_bare_list_of_tensors_keeps_each_tensor(tmp_path) -> None:
    save_state(tmp_path / "c", [torch.zeros(2), torch.ones(2)])
    first, second = load_state(tmp_path / "c")[0]
    assert torch.equal(first, torch.zeros(2)) and torch.equal(second, torch.ones(2))


def test_refusals_at_the_root_and_nested_say_where_and_what_is_allowed(tmp_path) -> None:
    with pytest.raises(TypeError, match="^state key 3 at <root>: expected str keys$"):
        save_state(tmp_path / "c", {3: 1.0})
    with pytest.raises(TypeError) as exc:
        save_state(tmp_path / "c", {"a": [b"bytes"]})
    assert str(exc.value) == "state value at a.0: cannot store a bytes (tensors, arrays and JSON scalars only)"


def test_saving_creates_missing_parent_directories(tmp_path) -> None:
    digest = save_state(tmp_path / "run" / "checkpoints" / "g0001" / "m00003", {"w": torch.ones(1)})
    assert load_state(tmp_path / "run" / "checkpoints" / "g0001" / "m00003", expect_digest=digest)[1] == {}


def test_reformatted_json_is_not_damage(tmp_path) -> None:
    """The digest covers the content, not the bytes: another key order or indentation is accepted."""
    digest = save_state(tmp_path / "c", {"w": torch.ones(2), "lr": 0.1, "z": {"b": 1, "a": 2}})
    f = tmp_path / "c" / "state.json"
    doc = json.loads(f.read_text())
    doc["body"] = dict(reversed(list(doc["body"].items())))
    f.write_text(json.dumps(doc, indent=2))
    assert load_state(tmp_path / "c", expect_digest=digest)[0]["lr"] == 0.1


def test_a_digest_mismatch_names_both_digests(tmp_path) -> None:
    digest = save_state(tmp_path / "c", {"w": torch.ones(2)})
    with pytest.raises(CheckpointError) as exc:
        load_state(tmp_path / "c", expect_digest="ab" * 32)
    assert str(exc.value) == (f"{tmp_path / 'c'}: checkpoint digest {digest[:12]}… is not the one the run store "
                              f"recorded ({'ab' * 6}…)")
