.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

# Bytecode caches on for the run, whatever the shell says: its processes write the .pyc of what they import that the
# set-up's background compile has not reached yet, and the next process reads them.
run:
	bash scripts/setup.sh --packages-only && env -u PYTHONDONTWRITEBYTECODE .venv/bin/lego run

test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check lego lego_cli flows tests
