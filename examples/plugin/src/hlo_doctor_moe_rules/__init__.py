"""hlo-doctor-moe-rules: an example hlo-doctor rule plugin for mixture-of-experts programs.

Rules (registered in the ``hlo_doctor.rules`` entry-point group):

* ``expert-weights-not-expert-sharded``: :class:`ExpertWeightsNotExpertSharded`
"""

from hlo_doctor_moe_rules.expert_weights import ExpertWeightsNotExpertSharded

__all__ = ["ExpertWeightsNotExpertSharded"]
