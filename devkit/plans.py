"""A statement's query plan as PostgreSQL ran it (EXPLAIN ANALYZE), node by node: what the
tests and benches check a statement reads (an index range, never a whole table)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlanNode:
    node_type: str
    relation: str | None
    index: str | None
    index_cond: str | None
    actual_rows: float | None
    removed_by_filter: float | None


def plan_nodes(plan: dict[str, Any]) -> list[PlanNode]:
    node = PlanNode(
        node_type=plan["Node Type"],
        relation=plan.get("Relation Name"),
        index=plan.get("Index Name"),
        index_cond=plan.get("Index Cond"),
        actual_rows=plan.get("Actual Rows"),
        removed_by_filter=plan.get("Rows Removed by Filter"),
    )
    return [node] + [n for child in plan.get("Plans", []) for n in plan_nodes(child)]


def explain(conn: Any, sql: str, *, analyze: bool = False, **params: Any) -> list[PlanNode]:
    """The plan's nodes; with analyze the statement runs in a transaction rolled back."""
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    conn.run("BEGIN")
    try:
        [[document]] = conn.run(f"EXPLAIN ({options}) {sql}", **params)
    finally:
        conn.run("ROLLBACK")
    if isinstance(document, str):
        document = json.loads(document)
    return plan_nodes(document[0]["Plan"])


def whole_table_reads(nodes: list[PlanNode]) -> list[str]:
    """The tables a plan reads whole (Seq Scan), sorted."""
    return sorted({str(n.relation) for n in nodes if n.node_type == "Seq Scan"})
