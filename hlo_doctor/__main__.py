"""``python -m hlo_doctor`` (venvs without the console script)."""

from hlo_doctor.cli import main

main()
