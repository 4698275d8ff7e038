"""The row of tabs at the top of every screen: one per mode, clickable, keys 1-6."""

from textual import on
from textual.widgets import Tab, Tabs

MODE_TABS: tuple[tuple[str, str], ...] = (
    ("nodes", "1 Nodes"),
    ("models", "2 Models"),
    ("assign", "3 Assign"),
    ("launch", "4 Launch"),
    ("dashboard", "5 Dashboard"),
    ("logs", "6 Logs"),
)


class ModeBar(Tabs):
    """Tabs naming the screens; activating one switches the app to that screen."""

    def __init__(self, active: str) -> None:
        super().__init__(*(Tab(title, id=mode) for mode, title in MODE_TABS), active=active)
        self.can_focus = False  # keys 1-6 and the mouse switch screens; Tab moves in the body

    @on(Tabs.TabActivated)
    def _switch_mode(self, event: Tabs.TabActivated) -> None:
        event.stop()
        mode = event.tab.id
        if mode is not None and mode != self.app.current_mode:
            self.app.switch_mode(mode)
