"""The studio's screens (each a textual Screen). They never call the app: they post messages
(studio/messages.py) that StudioApp handles, and get what they show through their constructor.

  setup_screen       every knob a run needs, validated as you type, with the VRAM panel beside it
  dashboard_screen   the live dashboard of one run: charts, Δlogp histogram, hardware, samples, events
  runs_list_screen   every run under the runs folder: open, mark and compare, A/B dtype, export
  compare_screen     two or more runs overlaid on the same charts
  modals             the modal dialogs: a yes/no confirmation and a path prompt
  keys_help          the keys help (`?` / F1): the keys of the screen below and of the app, scrolling
"""
