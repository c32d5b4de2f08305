"""``python -m experiments.async_bn``."""

from . import main

main()
