"""Plain-text reports shared by the command line and the demo (timings per phase,
a schema summary); kept apart from both so that neither imports the other."""

from __future__ import annotations

from typing import Any

__all__ = ["print_timings", "schema_summary"]


def print_timings(timings: dict[str, float], rows: int | None = None) -> None:
    print("\nphase                     seconds" + ("     rows/s" if rows else ""))
    for name, secs in timings.items():
        rate = f"  {rows / secs:>9,.0f}" if rows and secs > 0 else ""
        print(f"  {name:<22} {secs:>8.2f}{rate}")


def schema_summary(schema: Any) -> str:
    lines = [f"{'column':<14} {'dtype':<8} {'tags':<40} cardinality  emb.dim"]
    for col in schema:
        emb = col.properties.get("embedding_sizes") or {}
        card = str(col.cardinality) if col.cardinality is not None else ""
        tags = ",".join(sorted(t.value for t in col.tags))
        lines.append(f"{col.name:<14} {col.dtype + ('[]' if col.is_list else ''):<8} "
                     f"{tags:<40} {card:>11}  {emb.get('dimension', ''):>7}")
    return "\n".join(lines)
