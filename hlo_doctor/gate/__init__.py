"""The CI gate: baselines and dump diffs.

The commands are in :mod:`hlo_doctor.cli.gate`, the fingerprints in :mod:`hlo_doctor.fingerprint`.
"""
