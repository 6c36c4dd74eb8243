"""Geometry of the leaderboard's SVG charts (drawn by the template). No Django.

Server-side SVG: nothing is loaded from the network, and it scales on a phone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

ROW = 24
LABEL = 170
WIDTH = 620
CELL = 34


def interval_chart(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each model's interval as a horizontal bar with a dot at its rating. An open end (a bound
    of None: fix-ability with no fix, or no failure, observed) runs to the chart's edge; a row
    without a rating (nothing to compare) is left out."""
    rows = [row for row in rows if row["rating"] is not None]
    if not rows:
        return {"width": WIDTH, "height": ROW, "bars": [], "ticks": []}
    # An open side (``lower`` or ``upper`` None: the votes put no bound there) runs to the
    # chart's edge, with an arrow in the label.
    finite = [value for row in rows for value in (row["lower"], row["upper"], row["rating"]) if value is not None]
    low, high = min(finite), max(finite)
    step = _nice_step(high - low)
    low, high = math.floor(low / step) * step, math.ceil(high / step) * step
    if high == low:
        low, high = low - step, high + step
    span = WIDTH - LABEL - 20

    def x(value: float) -> float:
        return round(LABEL + (value - low) / (high - low) * span, 1)

    bars = [
        {
            "model": row["model"],
            "y": (index + 1) * ROW,
            "x1": x(low if row["lower"] is None else row["lower"]),
            "x2": x(high if row["upper"] is None else row["upper"]),
            "cx": x(row["rating"]),
            "label": _label(row),
        }
        for index, row in enumerate(rows)
    ]
    count = round((high - low) / step)
    ticks = [{"x": x(low + i * step), "label": f"{low + i * step:.0f}"} for i in range(count + 1)]
    return {
        "width": WIDTH,
        "height": (len(rows) + 2) * ROW,
        "bars": bars,
        "ticks": ticks,
        "axis_y": (len(rows) + 1) * ROW,
    }


def _label(row: dict[str, Any]) -> str:
    if row["lower"] is None and row["upper"] is None:
        return "no bound either way"
    if row["upper"] is None:
        return f"≥ {row['lower']:.0f} (no upper bound)"
    if row["lower"] is None:
        return f"≤ {row['upper']:.0f} (no lower bound)"
    return f"{row['rating']:.0f} ({row['lower']:.0f}–{row['upper']:.0f})"


def _nice_step(span: float) -> float:
    if span <= 0:
        return 10.0
    raw = span / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def heatmap(names: Sequence[str], values: Sequence[Sequence[float | None]], *, kind: str) -> dict[str, Any]:
    """Cells of a square matrix: ``kind`` "fraction" (0 red, ½ white, 1 blue) or "count"."""
    n = len(names)
    peak = max((v for line in values for v in line if v is not None), default=0) or 1
    cells = []
    for i in range(n):
        for j in range(n):
            value = values[i][j] if i < len(values) and j < len(values[i]) else None
            if kind == "fraction":
                fill = _diverging(value) if value is not None and i != j else "#eee"
                text = f"{value:.2f}" if value is not None and i != j else ""
            else:
                share = (value or 0) / peak
                fill = _blend((255, 255, 255), (40, 90, 160), share) if i != j else "#eee"
                text = f"{int(value)}" if value else ""
            cells.append(
                {
                    "x": LABEL + j * CELL,
                    "y": 20 + i * CELL,
                    "fill": fill,
                    "text": text,
                    "title": f"{names[i]} vs {names[j]}: {text or '—'}",
                }
            )
    return {
        "width": LABEL + n * CELL + 10,
        "height": 20 + n * CELL + 10,
        "cell": CELL,
        "cells": cells,
        "rows": [{"name": name, "y": 20 + i * CELL + CELL / 2} for i, name in enumerate(names)],
        "columns": [{"index": i + 1, "x": LABEL + i * CELL + CELL / 2} for i in range(n)],
    }


def _diverging(value: float) -> str:
    if value < 0.5:
        return _blend((200, 40, 40), (255, 255, 255), value * 2)
    return _blend((255, 255, 255), (40, 90, 200), (value - 0.5) * 2)


def _blend(start: tuple[int, int, int], end: tuple[int, int, int], share: float) -> str:
    share = min(max(share, 0.0), 1.0)
    return "#" + "".join(f"{round(a + (b - a) * share):02x}" for a, b in zip(start, end, strict=True))
