"""What a run sends out: checkpoints, exports, trackers and alerts.

checkpoint     checkpoints/step-N/: adapters or weights, optimizer, RNG, atomically
export         a checkpoint as merged safetensors, GGUF, or a Hub push
outlets        trackers and alerts, fed every metrics row
trackers       tracker fan-out (report.to)
alerts         alert rules and events, delivered

May import: contract, engine.precision, engine.model.
"""
