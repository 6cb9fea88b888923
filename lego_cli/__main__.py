"""`python -m lego_cli` is the `lego` command."""

from lego_cli import main

main()
