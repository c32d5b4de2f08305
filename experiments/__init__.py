"""The experiment scripts, one question each.

In a checkout this folder is the package ``experiments`` (``python -m experiments.<name>``); the
wheel ships the same files as ``jaxstale.experiments`` (the ``jaxstale <name>`` command), so the
scripts import their shared helpers relatively (``from .common import ...``).
"""
