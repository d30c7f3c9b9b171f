"""The run store contract over evo's SQLite RunStore."""

from evo.testing import RunStoreContract


class TestRunStore(RunStoreContract):
    pass
