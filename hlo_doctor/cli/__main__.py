"""``python -m hlo_doctor.cli`` (venvs without the console script)."""

from hlo_doctor.cli import main

main()
