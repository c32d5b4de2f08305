"""``python -m jaxstale``: the ``jaxstale`` command (see :mod:`jaxstale.cli`)."""

if __name__ == "__main__":
    import sys

    from jaxstale.cli import main

    sys.exit(main())
