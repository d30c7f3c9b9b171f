"""Recorded leaderboards of tiny real runs: refactors must leave every decision in them identical
(and their loss metrics within 1%: record.py says why not to the bit).

`python -m tests.golden.record` re-records them (only when a change of behaviour is intended;
say why in the commit). `tests/test_golden.py` compares a fresh run with the recording.
"""
