"""grpo-studio's GRPO engine. Never imports textual (see tests/test_import_hygiene.py)."""

__version__ = "0.1.0"
