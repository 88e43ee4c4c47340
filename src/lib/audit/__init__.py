"""The audit of hosted images: a check of each archived record's hosted copy, in rotation,
and the repair of what it finds missing or altered (docs/audit.md)."""
