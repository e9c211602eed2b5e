# The two commands of README.md:
#   make studio   set up, then open the studio on the bundled default (tiny model, CPU)
#   make test     set up, then lint (ruff) and run the whole test suite
VENV ?= .venv
export VLLM_CPU_KVCACHE_SPACE ?= 1
export HF_HUB_OFFLINE ?= 1

.PHONY: setup studio test lint format train screenshots mutation gpu-check
setup:
	@scripts/setup.sh

studio: setup
	$(VENV)/bin/grpo-studio

train: setup
	$(VENV)/bin/grpo-studio train tiny-arith

test: setup lint
	$(VENV)/bin/python -m pytest tests -q --durations=25

# ruff (pyproject.toml): the linter, and the formatter as a check; `make format` rewrites the tree
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

screenshots: setup
	$(VENV)/bin/python scripts/screenshots.py

# A benchmark of the tests, not part of `make test`: mutmut's small bugs in the engine's core (advantages,
# losses, mismatch, loss scaler, checkpoints, LR schedule, config validation) against the fast tests.
# Score and surviving mutants: .mutation/report.md (about 15 minutes on 2 cores).
mutation: setup
	$(VENV)/bin/python scripts/mutation.py

# On a CUDA box: vLLM CUDA, the Triton log-prob kernel, fp8, the fp16 scaler and the VRAM estimate, on the real
# model (SmolLM2-135M-Instruct), one table (scripts/gpu_check.py). Without a GPU it says so in one line.
gpu-check: setup
	$(VENV)/bin/python scripts/gpu_check.py
