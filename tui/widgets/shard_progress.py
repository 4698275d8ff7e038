"""One shard loading its weights: which shard on which node, and a progress bar.

Its parts are made with the widget, so `show` may be called at any time, before the widget
is mounted too (loading events of one shard can come faster than the screen mounts it)."""

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from tui import formatting as fmt


class ShardProgress(Horizontal):
    def __init__(self, shard_id: str, node: str) -> None:
        super().__init__()
        self.shard_id = shard_id
        self.node = node
        self._bar = ProgressBar(total=None, show_eta=False)
        self._bytes = Label("", classes="shard-bytes")

    def compose(self) -> ComposeResult:
        yield Label(f"{self.shard_id} on {self.node}")
        yield self._bar
        yield self._bytes

    def show(self, loaded_bytes: int, total_bytes: int) -> None:
        self._bar.update(total=max(total_bytes, 1), progress=loaded_bytes)
        self._bytes.update(f" {fmt.size(loaded_bytes)} / {fmt.size(total_bytes)}")
