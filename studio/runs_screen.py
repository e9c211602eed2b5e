"""Moved to screens/runs_list_screen.py. This re-export keeps the old import path working for
tests/test_export.py until it imports the new one; then delete this file."""

from grpo_studio.studio.screens.runs_list_screen import RunsScreen  # noqa: F401
