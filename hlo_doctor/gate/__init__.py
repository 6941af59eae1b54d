"""The CI gate: stable finding fingerprints, baselines, ``check`` and ``diff``."""
