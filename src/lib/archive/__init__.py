"""The archive itself: the worker, retry rules, time budget, sweeper, producer side."""
