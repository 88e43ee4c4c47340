"""Completion events on EventBridge, from the outbox: entries, publisher, the sweeper's part."""
