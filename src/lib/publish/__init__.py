"""Completion events on EventBridge, from the outbox: what a conclusion publishes
(entries), the archive function's publisher, and the sweeper's publication of leftovers."""
