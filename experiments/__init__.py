"""Experiments: the systems under test (phub and its baselines), the compute replay and the runner."""
