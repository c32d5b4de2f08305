"""Run folders, code fingerprints, result tables, learning-curve figures and the command line.

* :mod:`~experiments.runs.folder` — :class:`RunFolder`: config, per-cell results, metrics,
  summary, table and plots of one experiment run, written atomically and resumable;
  :class:`RunFolderError` and :class:`StaleResultsError`;
* :mod:`~experiments.runs.fingerprint` — :func:`code_fingerprint`: which code computed a run (so a
  resumed run never mixes results of different code);
* :mod:`~experiments.runs.tables` — ``mean ± std`` cells and markdown tables;
* :mod:`~experiments.runs.stats` — confidence intervals, diverged fractions, selection of a tuned
  knob on the validation split, time to accuracy, tuned tables;
* :mod:`~experiments.runs.plots` — learning-curve figures and per-method styles;
* :mod:`~experiments.runs.cli` — the common command line and progress lines.
"""

from .cli import OneLineParser as OneLineParser
from .cli import cli_parser as cli_parser
from .cli import float_list as float_list
from .cli import int_list as int_list
from .cli import name_list as name_list
from .cli import number as number
from .cli import progress as progress
from .files import accepted_codes as accepted_codes
from .files import atomic_write_bytes as atomic_write_bytes
from .fingerprint import RESULT_PARTS as RESULT_PARTS
from .fingerprint import backend_fingerprint as backend_fingerprint
from .fingerprint import code_changes as code_changes
from .fingerprint import code_fingerprint as code_fingerprint
from .fingerprint import code_hash as code_hash
from .fingerprint import source_digest as source_digest
from .fingerprint import user_source_text as user_source_text
from .folder import RESULTS_DIR as RESULTS_DIR
from .folder import RunFolder as RunFolder
from .folder import RunFolderError as RunFolderError
from .folder import StaleResultsError as StaleResultsError
from .folder import atomic_write_text as atomic_write_text
from .folder import config_hash as config_hash
from .folder import to_json as to_json
from .plots import add_footer as add_footer
from .plots import axis_label as axis_label
from .plots import clipped_errorbar as clipped_errorbar
from .plots import curves_figure as curves_figure
from .plots import draw_levels as draw_levels
from .plots import finish_figure as finish_figure
from .plots import method_style as method_style
from .stats import format_ci as format_ci
from .stats import format_steps as format_steps
from .stats import mean_ci as mean_ci
from .stats import paired_difference as paired_difference
from .stats import select as select
from .stats import time_to_accuracy as time_to_accuracy
from .stats import tuned_table as tuned_table
from .tables import format_mean_std as format_mean_std
from .tables import markdown_table as markdown_table
from .tables import mean_std_table as mean_std_table

__all__ = [
    "RESULTS_DIR",
    "RESULT_PARTS",
    "OneLineParser",
    "RunFolder",
    "RunFolderError",
    "StaleResultsError",
    "accepted_codes",
    "add_footer",
    "atomic_write_bytes",
    "atomic_write_text",
    "axis_label",
    "backend_fingerprint",
    "cli_parser",
    "clipped_errorbar",
    "code_changes",
    "code_fingerprint",
    "code_hash",
    "config_hash",
    "curves_figure",
    "draw_levels",
    "finish_figure",
    "float_list",
    "format_ci",
    "format_mean_std",
    "format_steps",
    "int_list",
    "markdown_table",
    "mean_ci",
    "mean_std_table",
    "method_style",
    "name_list",
    "number",
    "paired_difference",
    "progress",
    "select",
    "source_digest",
    "time_to_accuracy",
    "to_json",
    "tuned_table",
    "user_source_text",
]
