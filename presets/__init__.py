"""Data shipped with grpo-studio: run recipes, model cards, and the bundled tiny model."""
