"""Moved to screens/dashboard_screen.py. This re-export keeps the old import path working for
tests/test_alerts.py until it imports the new one; then delete this file."""

from grpo_studio.studio.screens.dashboard_screen import EVENT_STYLE, STATE_STYLE, DashboardScreen  # noqa: F401
