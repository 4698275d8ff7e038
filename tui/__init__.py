"""The specctl TUI (Textual): nodes, models, assignment, launch, live dashboard, logs.

A client of the control plane: it edits and applies the same cluster.toml as `specctl apply`
through the same functions, and reads the same store; it never imports torch, ray or
transformers. The headless parts (`tui.core`) import no textual either.

    specctl                 # ./cluster.toml, else the embedded examples/local.toml
    specctl cluster.toml    # that file
"""
