"""The gallery's runnable programs. Each file is a script: run it, do not import it."""
