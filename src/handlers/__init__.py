"""The Lambda entry points: handlers.archive (SQS) and handlers.sweeper (schedule)."""
