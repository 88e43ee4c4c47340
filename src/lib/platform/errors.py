"""The service's own errors: one root, so a handler can tell "ours" from a bug."""

from __future__ import annotations


class ServiceError(Exception):
    """Root of every error this service raises on purpose; anything else is a bug."""


class ConfigError(ServiceError):
    """A required setting is missing or unusable; the message names it, never its value."""


class DatabaseUnavailable(ServiceError):
    """The database could not be reached or dropped the connection; nothing was concluded."""
