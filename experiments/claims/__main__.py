"""``python -m experiments.claims``."""

from . import main

main()
