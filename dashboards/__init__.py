"""The evo web dashboard: a live, local, read-only view of evolution (`evo dashboard`).

It reads run stores (opened read-only) and imports `evo`; the engine never imports it — the
`evo dashboard` subcommand is registered through the `evo.commands` entry-point group. Needs the
`dashboard` extra (Starlette, uvicorn, plotly).
"""
