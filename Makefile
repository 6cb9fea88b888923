.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

# Bytecode caches on for the run, whatever the shell says: the set-up installs the venv without bytecode, so the
# run's processes write the .pyc of what they import and the next process reads them (scripts/setup.sh).
run:
	bash scripts/setup.sh --packages-only && env -u PYTHONDONTWRITEBYTECODE .venv/bin/lego run

test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check lego lego_cli flows tests
