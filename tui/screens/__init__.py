"""One screen per module: nodes, models, assign, launch, dashboard, logs, and the dialogs."""
