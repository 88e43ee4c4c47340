"""Lsky's rate limiter and the upload slots under it: pure rules, the ledger's and an attempt's."""
