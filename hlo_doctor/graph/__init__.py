"""Dataflow graph over the IR, and sharding semantics."""
