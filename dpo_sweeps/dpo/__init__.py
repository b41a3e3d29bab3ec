"""The preference-optimization math: losses and the log-probabilities they are computed from."""
