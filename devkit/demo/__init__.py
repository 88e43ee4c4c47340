"""`make local`: the whole pipeline on this machine, on embedded defaults.

Starts a throwaway PostgreSQL, moto's SQS, a Lsky Pro stand-in that stores files on
disk and serves them, and an upstream that serves generated sample images (some
slow, some failing at first, one gone, one failing for good). Seeds records the way
the generation service would (lib.archive.enqueue: row first, then message), plus a record
whose message was lost, one left RUNNING by a crashed attempt, and a malformed
message. Then runs the real handlers: the archive function in MaximumConcurrency
containers fed by an event-source-mapping poller, and the sweeper on a timer.
Prints a line per event, a summary table and the archived files' paths.

    python -m devkit.demo [--records N] [--short] [--concurrency N] [--batch-size N]

`--short` is the CI mode: few records, 1 s / 2 s backoff, done in about 10 s.
Ctrl-C stops everything it started (containers, servers, the cluster) and exits 130.

Modules: `scenario` (the records and what they should end as), `services` (the local
servers and the functions' environment), `run` (containers, event sources, the wait
and the summary), `report` (what is printed). Submodules are imported on use: the
spawned containers import this package too, and should not pay for the rest.
"""
