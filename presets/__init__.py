"""Data shipped with grpo-studio: run recipes (recipes/), model cards for the planner (cards/), the
bundled tiny model (models/), the built-in multi-turn environments (environments/: calculator, lookup,
guess_number, standalone example files a user can copy; env.environment names them) and chat templates
(templates/: chatml_tools.jinja, ChatML with tool calls).
"""
