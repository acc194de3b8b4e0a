"""Where each node of a workflow's graph is drawn: a layered layout, computed here, drawn as inline SVG by
templates/workflow.html (no JavaScript, no graph library).

A node's column (its layer) is the longest path to it from a node with nothing before it, so every edge
points right. Within a column the nodes are ordered by the mean row of the nodes before them (one sweep,
left to right), which untangles diamonds and fans without a crossing-minimisation pass; each column is
centred on the tallest one. Edges are cubic curves from a box's right side to the next box's left side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

COLUMN_GAP = 72  # between a column's boxes and the next column's
ROW_GAP = 24
MARGIN = 8


@dataclass(frozen=True)
class Box:
    name: str
    layer: int
    row: int
    x: float
    y: float


@dataclass(frozen=True)
class Line:
    upstream: str
    downstream: str
    path: str  # an SVG path's `d`


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    lines: list[Line]
    width: float
    height: float
    box_width: float
    box_height: float


def layers(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each node's layer: the longest path to it from a source (a node with no edge into it). ValueError on
    a cycle (a workflow never has one: enqueue refuses it)."""
    after: dict[str, list[str]] = {name: [] for name in names}
    waiting = dict.fromkeys(names, 0)
    for upstream, downstream in edges:
        after[upstream].append(downstream)
        waiting[downstream] += 1
    layer = dict.fromkeys(names, 0)
    ready = [name for name in names if waiting[name] == 0]
    placed = 0
    while ready:
        name = ready.pop()
        placed += 1
        for downstream in after[name]:
            layer[downstream] = max(layer[downstream], layer[name] + 1)
            waiting[downstream] -= 1
            if waiting[downstream] == 0:
                ready.append(downstream)
    if placed != len(names):
        raise ValueError("the graph has a cycle")
    return layer


def layout(
    names: Sequence[str], edges: Sequence[tuple[str, str]], box_width: float = 200, box_height: float = 64
) -> Layout:
    """Boxes for `names` (in the order to prefer within a column) and lines for `edges` (upstream, downstream)."""
    layer_of = layers(names, edges)
    before: dict[str, list[str]] = {name: [] for name in names}
    for upstream, downstream in edges:
        before[downstream].append(upstream)
    columns: list[list[str]] = [[] for _ in range(max(layer_of.values(), default=-1) + 1)]
    for name in names:
        columns[layer_of[name]].append(name)
    row_of: dict[str, int] = {}
    for column in columns:
        # Python's sort is stable: nodes with the same mean keep the given order.
        column.sort(key=lambda name: _mean(row_of[up] for up in before[name]))
        row_of.update((name, row) for row, name in enumerate(column))
    rows = max((len(column) for column in columns), default=0)
    step_x, step_y = box_width + COLUMN_GAP, box_height + ROW_GAP
    boxes: dict[str, Box] = {}
    for layer, column in enumerate(columns):
        offset = (rows - len(column)) * step_y / 2
        for row, name in enumerate(column):
            boxes[name] = Box(name, layer, row, MARGIN + layer * step_x, MARGIN + offset + row * step_y)
    lines = []
    for upstream, downstream in edges:
        start, end = boxes[upstream], boxes[downstream]
        x1, y1 = start.x + box_width, start.y + box_height / 2
        x2, y2 = end.x, end.y + box_height / 2
        bend = min(COLUMN_GAP, (x2 - x1) / 2)
        path = f"M{x1:g},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2:g},{y2:g}"
        lines.append(Line(upstream, downstream, path))
    width = 2 * MARGIN + len(columns) * step_x - COLUMN_GAP if columns else 0
    height = 2 * MARGIN + rows * step_y - ROW_GAP if rows else 0
    return Layout(boxes, lines, width, height, box_width, box_height)


def _mean(values: Iterable[int]) -> float:
    found = list(values)
    return sum(found) / len(found) if found else 0.0
