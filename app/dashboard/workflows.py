"""The workflows: their list, one workflow's graph (inline SVG laid out by graph_layout) with its table of
nodes, and the operator's actions on a node (retry, skip, cancel) or on the whole workflow (cancel).

Every figure comes from the counters of dygo_workflows and dygo_nodes (store.workflows): no page counts the
jobs of a group, so a page costs the same for a group of ten jobs or of a million.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from dygo.app.dashboard import graph_layout
from dygo.app.dashboard.rendering import redirect, render
from dygo.app.dashboard.visitor import Action, Page, Refused
from dygo.app.db import Conn, ReadConn
from dygo.store import workflows
from dygo.store.errors import Conflict, NotFound
from fastapi import APIRouter, Request
from fastapi.responses import Response

PAGE_SIZE = 50
WORKFLOW_STATES = ("running", "succeeded", "failed", "cancelled")
NODE_ACTIONS = {"retry": "retried", "skip": "skipped", "cancel": "cancelled"}  # action: what the flash says
# A mark beside each state's word in the graph, so a state never rests on its colour alone.
NODE_MARKS = {"waiting": "◷", "running": "▶", "succeeded": "✓", "failed": "✗", "cancelled": "⊘", "skipped": "↷"}
# What an edge's state means, for its tooltip and the legend (the table of nodes names the state).
EDGE_WORDS = {
    "open": "the node before has not ended",
    "met": "the node before ended as this edge needs: the node after may run",
    "cancel": "cancels the node after",
    "skip": "skips the node after",
    "held": "holds the node after until the one before is retried",
}
# The graph's boxes: about this many pixels per character (13px system font), within these widths.
CHAR_WIDTH, BOX_MIN, BOX_MAX, LINE_HEIGHT = 7.0, 170, 320, 17

router = APIRouter()


@router.get("/workflows")
def workflows_page(request: Request, visitor: Page, conn: ReadConn, state: str = "", before: str = "") -> Response:
    state = state if state in WORKFLOW_STATES else ""
    start = int(before) if before.isdigit() and len(before) < 19 else None
    found = workflows.list_workflows(conn, state=state or None, before=start, limit=PAGE_SIZE + 1)
    shown = found[:PAGE_SIZE]
    next_link = None
    if len(found) > PAGE_SIZE:
        next_link = "?" + urlencode({**({"state": state} if state else {}), "before": shown[-1]["id"]})
    return render(
        request, visitor, "workflows.html", workflows=shown, state=state, states=WORKFLOW_STATES, next_link=next_link
    )


@router.get("/workflows/{workflow_id}")
def workflow_page(request: Request, workflow_id: int, visitor: Page, conn: Conn) -> Response:
    try:
        workflow = workflows.get_workflow(conn, workflow_id)
    except NotFound:
        raise Refused(404, "No such workflow", f"There is no workflow with id {workflow_id}.") from None
    nodes = [_shown_node(node, workflow) for node in workflow["nodes"]]
    edges = workflow["edges"]
    lines = max((len(node["lines"]) for node in nodes), default=1)
    longest = max((len(text) for node in nodes for text in node["lines"]), default=0)
    box_width = min(max(longest * CHAR_WIDTH + 24, BOX_MIN), BOX_MAX)
    drawn = graph_layout.layout(
        [node["name"] for node in nodes],
        [(edge["upstream"], edge["downstream"]) for edge in edges],
        box_width=box_width,
        box_height=lines * LINE_HEIGHT + 14,
    )
    fits = int((box_width - 24) / CHAR_WIDTH)
    for node in nodes:
        node["box"] = drawn.boxes[node["name"]]
        node["drawn_lines"] = [text if len(text) <= fits else text[: fits - 1] + "…" for text in node["lines"]]
    policy = {(edge["upstream"], edge["downstream"]): edge for edge in edges}
    return render(
        request,
        visitor,
        "workflow.html",
        workflow=workflow,
        nodes=nodes,
        layout=drawn,
        lines=[(line, policy[(line.upstream, line.downstream)]) for line in drawn.lines],
        edge_words=EDGE_WORDS,
        line_height=LINE_HEIGHT,
        url=f"{visitor.prefix}/workflows/{workflow_id}",
    )


def _shown_node(node: dict[str, Any], workflow: dict[str, Any]) -> dict[str, Any]:
    """A node as the page draws it: its text lines (name first), its edges in, and the actions it takes."""
    state = node["state"]
    title = f"{NODE_MARKS.get(state, '')} {state}"
    lines = [node["name"], title + (f" · group of {node['jobs']:,}" if node["is_group"] else "")]
    if node["is_group"]:
        lines += group_counts(node)
    if node["wait"]:
        lines.append(node["wait"])
    after = [edge for edge in workflow["edges"] if edge["downstream"] == node["name"]]
    return {
        **node,
        "lines": lines,
        "after": after,
        "actions": node_actions(node, workflow["state"]),
        "anchor": "node-" + node["name"],
        "path": quote(node["name"], safe=""),
    }


def group_counts(node: dict[str, Any]) -> list[str]:
    """A group's jobs from its counters: '98 succeeded · 1 left · 1 failed', then a line of those
    cancelled and skipped if any."""
    lines = [f"{node['succeeded']:,} succeeded · {node['jobs_left']:,} left · {node['dead']:,} failed"]
    stopped = [f"{node[name]:,} {name}" for name in ("cancelled", "skipped") if node[name]]
    return lines + [" · ".join(stopped)] if stopped else lines


def node_actions(node: dict[str, Any], workflow_state: str) -> list[str]:
    """The actions that can move something of the node (store.workflows.act_on_node's rules): retry a node
    that ended failed or cancelled by its own jobs (one stopped by a node before it waits for that one's
    retry), skip or cancel one with jobs not yet ended. A cancelled workflow offers none: an operator
    stopped it on purpose."""
    if workflow_state == "cancelled":
        return []
    actions = []
    stopped_before = node["cancels"] or node["skips"]
    if node["state"] in ("failed", "cancelled") and not stopped_before and (node["dead"] or node["cancelled"]):
        actions.append("retry")
    if node["state"] in ("waiting", "running") and node["jobs_left"]:
        actions += ["skip", "cancel"]
    return actions


@router.post("/workflows/{workflow_id}/nodes/{name}/{action}")
def act_on_node(workflow_id: int, name: str, action: str, visitor: Action, conn: Conn) -> Response:
    back = f"{visitor.prefix}/workflows/{workflow_id}"
    if action not in NODE_ACTIONS:
        return redirect(visitor, back, f"Unknown action {action!r}.", "error")
    try:
        workflow = workflows.act_on_node(conn, workflow_id, name, action)
    except (NotFound, Conflict) as exc:
        return redirect(visitor, back, f"Node {name} was not {NODE_ACTIONS[action]}: {exc}", "error")
    node = next(node for node in workflow["nodes"] if node["name"] == name)
    if action != "retry" and node["state"] == "waiting":
        # Its jobs are; the node itself ends once the nodes before it have (store.workflows' rule).
        return redirect(
            visitor,
            back,
            f"Node {name}: its jobs not started are {NODE_ACTIONS[action]}; the node stays waiting until "
            f"the nodes before it end.",
        )
    return redirect(
        visitor,
        back,
        f"Node {name} {NODE_ACTIONS[action]}; it is now {node['state']}, the workflow {workflow['state']}.",
    )


@router.post("/workflows/{workflow_id}/cancel")
def cancel_workflow(workflow_id: int, visitor: Action, conn: Conn) -> Response:
    back = f"{visitor.prefix}/workflows/{workflow_id}"
    try:
        workflow = workflows.cancel_workflow(conn, workflow_id)
    except (NotFound, Conflict) as exc:
        return redirect(visitor, back, f"Workflow {workflow_id} was not cancelled: {exc}", "error")
    running = sum(node["state"] == "running" for node in workflow["nodes"])
    tail = f"; {running} running node{'s' * (running != 1)} end as their running jobs do" if running else ""
    return redirect(visitor, back, f"Workflow {workflow_id} cancelled{tail}.")
