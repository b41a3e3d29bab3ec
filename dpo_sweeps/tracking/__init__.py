"""Experiment trackers (tracking.backends): W&B, MLflow, TensorBoard and Trackio behind one interface
(backend.py), fed by rank 0's one Tracker (tracker.py); docs/trackers.md says what each shows."""
