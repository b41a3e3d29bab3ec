"""The training loop and what it writes as it goes (checkpoints, perf metrics, probes, tracking), and one
rank's whole run around it (lifecycle.py), entered through entry.py."""
