"""`build_replay` loads a spec's offline rows whether they come as one mapping or as a stream of chunks."""

import numpy as np

from evo.replay import Field, ReplaySpec, Schema, build_replay

SCHEMA = Schema({"x": Field("int64", (2,)), "row": Field("int64", ())}, key_fields=("row",))


def _rows(start: int, stop: int) -> dict[str, np.ndarray]:
    row = np.arange(start, stop, dtype=np.int64)
    return {"x": np.stack([row, -row], 1), "row": row}


def test_initial_rows_may_be_one_mapping_or_a_stream_of_chunks():
    whole = build_replay(ReplaySpec(SCHEMA, capacity=10, initial_rows=lambda: _rows(0, 10)), 0, distributed=False)
    pulled: list[int] = []

    def chunks():
        for start in range(0, 10, 4):
            pulled.append(start)
            yield _rows(start, min(start + 4, 10))

    streamed = build_replay(ReplaySpec(SCHEMA, capacity=10, initial_rows=chunks), 0, distributed=False)
    assert pulled == [0, 4, 8] and len(streamed) == len(whole) == 10
    keys = whole.hash(_rows(0, 10))
    np.testing.assert_array_equal(streamed.get(keys)["x"], whole.get(keys)["x"])
