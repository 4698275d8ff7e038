"""Nodes: every node of the cluster file, reachable or not and why, its CPUs, memory and Ray
state, and each GPU with memory, utilisation and temperature; read again every few seconds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static
from textual.worker import get_current_worker

from tui import formatting as fmt
from tui.messages import NodesRead
from tui.screens.base import SpecctlScreen

if TYPE_CHECKING:
    from tui.core.nodes import GpuStatus, NodeStatus
    from tui.core.session import ConfigSnapshot

NODE_COLUMNS = ("Node", "Address", "State", "Ray", "CPUs", "Memory free", "GPUs")
GPU_COLUMNS = ("Node", "GPU", "Memory used", "Util", "Temp")


def node_row(status: NodeStatus) -> tuple[str | Text, ...]:
    state = Text("ok", "green") if status.is_reachable else Text("unreachable", "bold red")
    ray_style = {True: "green", False: "dim", None: "yellow"}[status.ray.is_running]
    memory = (
        f"{fmt.size(status.memory_available_bytes)} / {fmt.size(status.memory_total_bytes)}"
        if status.is_reachable
        else fmt.MISSING
    )
    gpus = str(len(status.gpus)) if status.gpus else ("CPU" if status.is_reachable else "–")
    return (
        Text(status.name, "bold"),
        status.address,
        state,
        Text(status.ray.summary, ray_style),
        fmt.MISSING if status.num_cpus is None else str(status.num_cpus),
        memory,
        gpus,
    )


def gpu_row(node: str, gpu: GpuStatus) -> tuple[str | Text, ...]:
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    fraction = used / total if used is not None and total else None
    memory = f"{fmt.bar(fraction, 8)} {fmt.size(used)} / {fmt.size(total)}"
    if gpu.is_unified_memory:
        memory += " (unified)"
    util = fmt.MISSING if gpu.utilization_percent is None else f"{gpu.utilization_percent}%"
    temp = fmt.MISSING if gpu.temperature_c is None else f"{gpu.temperature_c} °C"
    return node, f"{gpu.index}: {gpu.name}", memory, util, temp


def node_detail(status: NodeStatus) -> Text:
    text = Text()
    text.append(f"{status.name}", "bold")
    if status.problem:
        text.append(f"  {status.problem}", "red")
        if status.declared:
            text.append(f"\ndeclared in the cluster file: {status.declared}", "dim")
        return text
    where = status.hostname or status.address
    text.append(f"  {where} ({'this machine' if status.is_local else 'specd'})")
    if status.gpu_note:
        text.append(f"; {status.gpu_note}", "dim")
    text.append(f"\nRay: {status.ray.summary}")
    return text


class NodesScreen(SpecctlScreen):
    MODE = "nodes"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self._statuses: list[NodeStatus] = []

    def compose_body(self) -> Iterable[Widget]:
        yield Static(
            "Reading the cluster file…", id="nodes-status", classes="status-line", markup=False
        )
        yield DataTable(id="node-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="node-detail")
        yield Label("GPUs", classes="section-title")
        yield DataTable(id="gpu-table", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one("#node-table", DataTable).add_columns(*NODE_COLUMNS)
        self.query_one("#gpu-table", DataTable).add_columns(*GPU_COLUMNS)
        interval = self.specctl.settings.nodes_refresh_s
        self.refresh_every(interval, self.action_refresh)
        self.watch(self.app, "deployment_revision", lambda _: self.action_refresh(), init=False)

    def session_changed(self, revision: int) -> None:
        if revision:
            self.action_refresh()

    def action_refresh(self) -> None:
        session = self.specctl.session
        if session is None:
            problem = self.specctl.session_problem
            self._show_status(problem or "Reading the cluster file…", bool(problem))
            return
        snapshot = session.snapshot()
        self.read_in_background("nodes", lambda: self._read_nodes(snapshot))

    @work(thread=True, group="nodes")
    def _read_nodes(self, snapshot: ConfigSnapshot) -> None:
        from tui.core.nodes import RayState, read_cluster_nodes
        from tui.core.status import read_deployment_status

        check = snapshot.check(read_models=False)
        if check.config is None:
            first = str(check.issues[0]) if check.issues else "invalid"
            self.post_message(NodesRead([], f"The cluster file has errors (see Assign): {first}"))
            return
        settings = self.specctl.settings
        deployed = read_deployment_status(settings.home)
        not_deployed = RayState("not running", False)
        fallback = (
            RayState(f"unknown: {deployed.problem}", None) if deployed.problem else not_deployed
        )
        local_ray = {
            node.name: deployed.local_ray.get(node.name, fallback)
            for node in check.config.nodes
            if node.is_local
        }
        statuses = read_cluster_nodes(check.config, settings.probe_timeout_s, local_ray)
        if not get_current_worker().is_cancelled:
            self.post_message(NodesRead(statuses))

    @on(NodesRead)
    def _show_nodes(self, message: NodesRead) -> None:
        if message.problem is not None:
            self._show_status(message.problem, True)
            return
        self._statuses = message.statuses
        self._fill_tables()
        num_down = sum(1 for s in message.statuses if not s.is_reachable)
        summary = f"{len(message.statuses)} node(s)"
        summary += f", {num_down} unreachable" if num_down else ", all reachable"
        every = self.specctl.settings.nodes_refresh_s
        self._show_status(f"{summary} · read every {every:g} s (r: now)", bool(num_down))

    def _fill_tables(self) -> None:
        nodes = self.query_one("#node-table", DataTable)
        row = nodes.cursor_row
        nodes.clear()
        gpus = self.query_one("#gpu-table", DataTable)
        gpus.clear()
        for status in self._statuses:
            nodes.add_row(*node_row(status), key=status.name)
            for gpu in status.gpus:
                gpus.add_row(*gpu_row(status.name, gpu))
        if not any(s.gpus for s in self._statuses):
            gpus.add_row("", Text("no GPU on any node read", "dim"), "", "", "")
        if self._statuses:
            nodes.move_cursor(row=min(row, len(self._statuses) - 1))
            self._show_detail(min(row, len(self._statuses) - 1))

    @on(DataTable.RowHighlighted, "#node-table")
    def _node_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def _show_detail(self, index: int) -> None:
        if 0 <= index < len(self._statuses):
            self.query_one("#node-detail", Static).update(node_detail(self._statuses[index]))

    def _show_status(self, text: str, is_problem: bool) -> None:
        line = self.query_one("#nodes-status", Static)
        line.update(text)
        line.set_class(is_problem, "-problem")
