# The two commands of README.md:
#   make studio   set up, then open the studio on the bundled default (tiny model, CPU)
#   make test     set up, then run the whole test suite
VENV ?= .venv
export VLLM_CPU_KVCACHE_SPACE ?= 1
export HF_HUB_OFFLINE ?= 1

.PHONY: setup studio test train screenshots
setup:
	@scripts/setup.sh

studio: setup
	$(VENV)/bin/grpo-studio

train: setup
	$(VENV)/bin/grpo-studio train tiny-arith

test: setup
	$(VENV)/bin/python -m pytest tests -q

screenshots: setup
	$(VENV)/bin/python scripts/screenshots.py
