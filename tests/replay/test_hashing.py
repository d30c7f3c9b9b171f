"""Stable content hashing: fixed constants, same in any process, sensitive to every byte."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from evo.replay import Field, Schema, hash_rows
from tests.replay.helpers import SCHEMA, rows, take

KNOWN_ROW = {
    "obs": np.arange(8, dtype=np.float32)[None],
    "action": np.array([3]),
    "reward": np.array([1.5], np.float32),
    "next_obs": -np.arange(8, dtype=np.float32)[None],
    "done": np.array([True]),
}
# Frozen: changing the hash silently re-keys every stored dataset and snapshot.
KNOWN_KEY = 0x4576991F3DCA69A3


def test_known_row_has_fixed_key():
    assert int(hash_rows(SCHEMA, KNOWN_ROW)[0]) == KNOWN_KEY


def test_same_key_in_another_process_with_another_hash_seed():
    code = (
        "import numpy as np\n"
        "from tests.replay.test_hashing import KNOWN_ROW\n"
        "from tests.replay.helpers import SCHEMA\n"
        "from evo.replay import hash_rows\n"
        "print(int(hash_rows(SCHEMA, KNOWN_ROW)[0]), hash('python-hash-differs'))\n"
    )
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), check=True)
        outs.append(out.stdout.split())
    assert int(outs[0][0]) == int(outs[1][0]) == KNOWN_KEY
    assert outs[0][1] != outs[1][1]  # Python's own hash() did change: ours must not depend on it


def test_vectorised_equals_row_by_row_and_field_order_free():
    b = rows(50)
    h = hash_rows(SCHEMA, b)
    assert h.dtype == np.uint64 and h.shape == (50,)
    for i in (0, 17, 49):
        assert hash_rows(SCHEMA, take(b, [i]))[0] == h[i]
    reordered = Schema({k: SCHEMA.fields[k] for k in reversed(list(SCHEMA.fields))})
    np.testing.assert_array_equal(hash_rows(reordered, dict(reversed(list(b.items())))), h)
    assert len(np.unique(h)) == 50


def test_every_byte_and_every_field_matters():
    b = take(rows(1), [0, 0, 0, 0, 0, 0, 0])
    b["obs"][1, 7] = np.nextafter(b["obs"][1, 7], np.float32(np.inf))
    b["action"][2] += 1
    b["reward"][3] = -b["reward"][3]
    b["next_obs"][4, 0] += 1
    b["done"][5] = not b["done"][5]
    b["obs"][6, 0] = b["obs"][6, 0] * 2 + 1
    assert len(np.unique(hash_rows(SCHEMA, b))) == 7


def test_negative_zero_is_another_key():
    """Keys hash bytes: -0.0 == 0.0 as floats, but the rows are stored as written, so both are kept."""
    b = take(rows(1), [0, 0])
    b["obs"][0, 0], b["obs"][1, 0] = 0.0, -0.0
    h = hash_rows(SCHEMA, b)
    assert h[0] != h[1]


def test_key_fields_aggregate_only_those_fields():
    s = Schema(SCHEMA.fields, key_fields=("obs", "action"))
    b = rows(3)
    b2 = {**b, "reward": b["reward"] + 1, "done": ~b["done"]}
    np.testing.assert_array_equal(hash_rows(s, b), hash_rows(s, b2))
    assert (hash_rows(SCHEMA, b) != hash_rows(SCHEMA, b2)).all()
    # only the key fields' layout matters: other non-key fields do not change the key ...
    other = Schema({"obs": Field("float32", (8,)), "action": Field("int64"), "x": Field("int8")}, key_fields=("obs", "action"))
    np.testing.assert_array_equal(hash_rows(other, {**b, "x": np.zeros(3, np.int8)}), hash_rows(s, b))
    # ... but the same bytes under another layout (names, dtypes, shapes) are a different key
    blob = np.concatenate([b["action"][:, None].view(np.uint8), b["obs"].view(np.uint8)], axis=1)
    raw = Schema({"blob": Field("uint8", (40,))})
    assert (hash_rows(raw, {"blob": blob}) != hash_rows(s, b)).all()


def test_big_endian_input_hashes_like_little_endian():
    b = rows(4)
    be = {k: v.astype(v.dtype.newbyteorder(">")) if v.dtype.itemsize > 1 else v for k, v in b.items()}
    s = Schema({k: Field(v.dtype.name, v.shape[1:]) for k, v in b.items()})
    np.testing.assert_array_equal(hash_rows(s, be), hash_rows(s, b))


def test_wide_rows_token_sequences():
    s = Schema({"tokens": Field("int64", (2000,)), "reward": Field("float32")})
    rng = np.random.default_rng(0)
    b = {"tokens": rng.integers(0, 50257, (6, 2000)), "reward": np.zeros(6, np.float32)}
    b["tokens"][1] = b["tokens"][0]
    b["tokens"][1, -1] += 1  # differs only in the last token
    h = hash_rows(s, b)
    assert len(np.unique(h)) == 6
    np.testing.assert_array_equal(hash_rows(s, b), h)
