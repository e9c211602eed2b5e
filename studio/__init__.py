"""The terminal studio (Textual). Never imports torch, transformers or vllm.

The app and the screens talk in messages: a screen posts one of messages.py, the app acts on it.

  app           StudioApp and the entry points (`grpo-studio`, `grpo-studio attach RUN`); handles the messages
  messages      what the screens ask of the app: launch, open, compare, duplicate, fork, export, navigate, ask the user
  screens/      each Screen: setup, dashboard, runs list, compare, the modal dialogs
  widgets/      the reusable widgets and renderables: charts, the VRAM panel, the perf tables, the rewards list
  panels        what each chart shows (metric keys per panel), shared by the dashboard, compare and report
  report        `grpo-studio report RUN`: a run's charts as PNGs (matplotlib) and a one-page HTML summary
  rundata       a run directory as the studio sees it: tails of its JSONL files, one column per metric
  launcher      start, stop and kill trainers (each in its own session), export in a child process, run folders
  fork          a run forked with one config change (a doctor's suggestion): its diff, its folder, its parent
  hardware      the GPUs and the host, as the setup screen and the Hardware tab show them
  models        what the model picker offers: bundled, packaged, cards, recipes, the local HF cache
  keymap        the user's key remapping (~/.config/grpo-studio/keymap.toml)
  lag           the Mismatch tab's verdict: rollout lag or precision
  vram_adapter  the VRAM planner's answer, shaped for the VRAM panel
  memory_rows   the Device tab's memory rows: one planned number per kind, the rehearsal's and the run's peaks
  rewards_info  the built-in rewards and their one-line descriptions, for the setup form
"""
