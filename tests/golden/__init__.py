"""Recorded leaderboards of tiny real runs: refactors must leave them identical to the bit.

`python -m tests.golden.record` re-records them (only when a change of behaviour is intended;
say why in the commit). `tests/test_golden.py` compares a fresh run with the recording.
"""
