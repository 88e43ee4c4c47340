"""The audit of hosted images and their repair (docs/explanation/audit-and-repair.md)."""
