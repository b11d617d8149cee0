"""Model surgery: the target grammar, selection, the edits, and what keeps the optimizer,
its schedulers and BatchNorm consistent, with history and undo."""
