"""The workflow graph's layout (app/dashboard/graph_layout.py): columns by longest path, rows by the nodes
before, every edge pointing right."""

from __future__ import annotations

import pytest
from dygo.app.dashboard.graph_layout import layers, layout

DIAMOND = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")]


def test_a_node_sits_one_column_after_the_longest_path_to_it():
    # x waits for a directly and for the whole chain a -> b -> c: it goes after c, not beside b.
    assert layers(["a", "b", "c", "x"], [("a", "b"), ("b", "c"), ("a", "x"), ("c", "x")]) == {
        "a": 0,
        "b": 1,
        "c": 2,
        "x": 3,
    }
    assert layers(["lone", "a", "b"], [("a", "b")]) == {"lone": 0, "a": 0, "b": 1}


def test_a_diamond_is_drawn_as_one_with_every_edge_pointing_right():
    drawn = layout(["a", "b", "c", "d", "e"], DIAMOND, box_width=100, box_height=40)
    boxes = drawn.boxes
    assert [boxes[name].layer for name in "abcde"] == [0, 1, 1, 2, 3]
    assert boxes["b"].x == boxes["c"].x and boxes["b"].y < boxes["c"].y
    # The single nodes are centred on the pair between them.
    assert boxes["a"].y == boxes["d"].y == (boxes["b"].y + boxes["c"].y) / 2
    assert len(drawn.lines) == len(DIAMOND)
    for line in drawn.lines:
        assert boxes[line.upstream].x + 100 < boxes[line.downstream].x
        assert line.path.startswith(f"M{boxes[line.upstream].x + 100:g},")
    right = max(box.x for box in boxes.values()) + 100
    bottom = max(box.y for box in boxes.values()) + 40
    assert right < drawn.width and bottom < drawn.height


def test_rows_follow_the_nodes_before_them_so_parallel_chains_do_not_cross():
    # Two chains given in an order that would cross if each column kept the given order.
    drawn = layout(["a1", "b1", "b2", "a2"], [("a1", "a2"), ("b1", "b2")])
    assert drawn.boxes["a1"].row == drawn.boxes["a2"].row == 0
    assert drawn.boxes["b1"].row == drawn.boxes["b2"].row == 1


def test_a_cycle_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        layers(["a", "b"], [("a", "b"), ("b", "a")])
