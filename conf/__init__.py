"""The config tree, as a package so that a regular (non-editable) install carries it."""
