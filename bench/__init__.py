"""Benchmarks for issue 7: memory, transfer overhead, per-message cost, cold start, sweeper.

`python -m bench.run` (or `make bench`) runs them all and prints one table; each
module also runs alone (`python -m bench.run --only memory`). They drive the public
handler (`handlers.archive.lambda_handler`) and lib APIs against the devkit services,
never the download/upload internals, so they survive refactors of those.
"""
