"""The archive state machine: ArchiveStatus, named queries, the one module running SQL."""
