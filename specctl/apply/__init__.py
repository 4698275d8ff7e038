"""`specctl apply / status / down`: bring a deployment up, report it, take it down.

The CLI and the TUI call the same functions (`apply_deployment`, `read_status`,
`take_down`); progress reaches either through the `ApplyEvents` surface.
"""
