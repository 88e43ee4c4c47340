"""The audit of hosted images, in rotation, and the repair of what it finds (docs/audit.md)."""
