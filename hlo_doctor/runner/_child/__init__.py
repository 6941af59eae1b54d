"""Files that run inside the child process (copied out, never imported from here)."""
