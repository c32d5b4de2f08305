"""``python -m study``."""

from . import main

main()
