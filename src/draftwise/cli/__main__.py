"""`python -m draftwise.cli` (bench-serve starts its server this way)."""

from draftwise.cli import main

main()
