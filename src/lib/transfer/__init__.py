"""Talking to the outside world: the guarded download, the Lsky Pro client, multipart bodies."""
