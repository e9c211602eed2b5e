"""Moved to screens/modals.py. This re-export keeps the old import path working for tests/test_export.py
and tests/test_preflight.py until they import the new one; then delete this file."""

from grpo_studio.studio.screens.modals import Confirm, PathPrompt  # noqa: F401
