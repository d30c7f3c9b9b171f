"""evo.environ.environ_restored: the variables a block sets, changes or removes are put back."""

import os

import pytest

from evo.environ import environ_restored


def test_set_changed_and_removed_variables_are_put_back(monkeypatch) -> None:
    monkeypatch.setenv("EVO_TEST_KEPT", "before")
    monkeypatch.setenv("EVO_TEST_REMOVED", "there")
    monkeypatch.delenv("EVO_TEST_NEW", raising=False)
    with environ_restored(["EVO_TEST_KEPT", "EVO_TEST_REMOVED", "EVO_TEST_NEW"]):
        os.environ.update({"EVO_TEST_KEPT": "during", "EVO_TEST_NEW": "1"})
        del os.environ["EVO_TEST_REMOVED"]
    assert os.environ["EVO_TEST_KEPT"] == "before" and os.environ["EVO_TEST_REMOVED"] == "there"
    assert "EVO_TEST_NEW" not in os.environ


def test_they_are_put_back_when_the_block_raises(monkeypatch) -> None:
    monkeypatch.delenv("EVO_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError), environ_restored(["EVO_TEST_NEW"]):
        os.environ["EVO_TEST_NEW"] = "1"
        raise RuntimeError("boom")
    assert "EVO_TEST_NEW" not in os.environ
