"""Moved to screens/dashboard_screen.py. This re-export keeps the old import path working for
tests/test_alerts.py until it imports the new one; then delete this file."""

from grpo_studio.studio.screens.dashboard_screen import DashboardScreen, EVENT_STYLE, STATE_STYLE  # noqa: F401
