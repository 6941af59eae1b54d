"""hlo-doctor: diagnose sharding problems in XLA SPMD programs from HLO dumps."""

__version__ = "0.1.0"
