"""The HPO benchmark: evo against random search, Ray Tune PBT/PB2 and AgileRL (issue 14).

    python -m benchmarks.hpo [--quick] [--seeds K] [--task cartpole|randomwalks|randomwalks-sparse]
        --json OUT.json [--plot OUT.png]

Modules: `common` (tasks, budgets, founders, curves), `evo_strategy`, `tune_strategies` (random
search, PBT, PB2 as Tune runs of the same agent), `agilerl_peer` (AgileRL's own venv and its runner
script `agilerl_runner`), `strategy` (one strategy × seed in a process of its own), `plot`, and
`__main__` (the interleaved schedule and the JSON). docs/benchmarks.md has the method and results.
"""
