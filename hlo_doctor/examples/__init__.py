"""The example gallery: small programs that show one sharding problem (bad/fixed pairs)
or a healthy model, each compiling on CPU in seconds.

Run one with ``hlo-doctor run --example NAME --variant bad``; list them with
``hlo-doctor examples``.
"""

from hlo_doctor.examples.registry import EXAMPLES, Example, get_example

__all__ = ["EXAMPLES", "Example", "get_example"]
