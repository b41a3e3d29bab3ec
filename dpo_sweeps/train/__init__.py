"""The training loop and what it writes as it goes: checkpoints, perf metrics, probes, tracking."""
