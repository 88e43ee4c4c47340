"""Tests; shared helpers live in tests.support, fixtures in tests/conftest.py."""
