"""``python -m jaxstale``: the ``jaxstale`` command (see :mod:`jaxstale.cli`)."""

if __name__ == "__main__":
    from jaxstale.cli import console

    console()
