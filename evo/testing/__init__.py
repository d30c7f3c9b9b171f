"""Contract suites any backend or user agent can run (Optuna's pattern: one suite, every backend).

Subclass one in a pytest file and say what to test:

* `AgentContract` — an agent class: seeded create, train/evaluate types, clone independence,
  bit-identical resume from its state, mutation records and bounds, function-preserving growth,
  export and `evo.load`;
* `SchedulerContract` — a scheduler backend: same results for the same seed, input order, a
  failing member reported alone, timeouts;
* `RunStoreContract` — the run store: transactional generation commits, exact read-back.

docs/agents.md shows how to run `AgentContract` against your own agent. pytest is needed only to
run the suites; importing `evo.testing` does not import it.
"""

from evo.testing.agent_contract import AgentContract
from evo.testing.compare import assert_same_state, state_differences
from evo.testing.runstore_contract import RunStoreContract
from evo.testing.scheduler_contract import SchedulerContract

__all__ = ["AgentContract", "SchedulerContract", "RunStoreContract", "assert_same_state", "state_differences"]
