"""``python -m stepwarm`` = the ``stepwarm`` command."""

from stepwarm.cli import main

main()
