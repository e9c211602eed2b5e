"""Data shipped with grpo-studio: run recipes (recipes/), model cards for the planner (cards/), and the
bundled tiny model (models/).
"""
