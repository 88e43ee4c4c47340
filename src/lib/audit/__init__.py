"""The audit of hosted images, in rotation, and the repair of what it finds
(docs/explanation/audit-and-repair.md)."""
