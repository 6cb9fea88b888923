.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run:
	bash scripts/setup.sh --packages-only && .venv/bin/lego run

test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check lego lego_cli flows tests
