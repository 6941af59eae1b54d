"""The built-in rules, one per module. They register through the ``hlo_doctor.rules``
entry-point group in hlo-doctor's ``pyproject.toml``, exactly as plugins do."""
