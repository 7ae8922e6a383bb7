"""Tables and JSON for the benchmark and replay commands.

Every command prints readable tables and, with ``--json PATH``, writes the
same numbers so runs can be compared over time.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


@dataclass
class Table:
    title: str
    columns: Sequence[str]
    rows: list[list[Any]] = field(default_factory=list)

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"{self.title}: row has {len(values)} values, table has {len(self.columns)} columns")
        self.rows.append(list(values))

    def render(self) -> str:
        cells = [[_fmt(v) for v in row] for row in self.rows]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        line = "  ".join("-" * w for w in widths)
        out = [self.title, line, "  ".join(c.rjust(w) for c, w in zip(self.columns, widths)), line]
        out += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "rows": [dict(zip(self.columns, row)) for row in self.rows]}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e7:
            return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
        return f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def emit(command: str, tables: Sequence[Table], json_path: str | None, **meta: Any) -> None:
    """Prints every table; writes them (and `meta`) as JSON when asked."""
    for table in tables:
        print(table.render())
        print()
    if json_path:
        payload = {
            "command": command,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            **meta,
            "tables": [t.to_json() for t in tables],
        }
        Path(json_path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
