"""Run folders, code fingerprints, result tables, learning-curve figures and the command line.

* :mod:`~jaxstale.runs.folder` — :class:`RunFolder`: config, per-cell results, metrics,
  summary, table and plots of one experiment run, written atomically and resumable;
  :class:`RunFolderError` and :class:`StaleResultsError`;
* :mod:`~jaxstale.runs.fingerprint` — :func:`code_fingerprint`: which code computed a run (so a
  resumed run never mixes results of different code);
* :mod:`~jaxstale.runs.tables` — ``mean ± std`` cells and markdown tables;
* :mod:`~jaxstale.runs.stats` — confidence intervals, diverged fractions, selection of a tuned
  knob on the validation split, time to accuracy, tuned tables;
* :mod:`~jaxstale.runs.plots` — learning-curve figures and per-method styles;
* :mod:`~jaxstale.runs.cli` — the common command line and progress lines.
"""

from jaxstale.runs.cli import OneLineParser as OneLineParser
from jaxstale.runs.cli import cli_parser as cli_parser
from jaxstale.runs.cli import float_list as float_list
from jaxstale.runs.cli import int_list as int_list
from jaxstale.runs.cli import name_list as name_list
from jaxstale.runs.cli import number as number
from jaxstale.runs.cli import progress as progress
from jaxstale.runs.files import accepted_codes as accepted_codes
from jaxstale.runs.files import atomic_write_bytes as atomic_write_bytes
from jaxstale.runs.fingerprint import RESULT_PARTS as RESULT_PARTS
from jaxstale.runs.fingerprint import backend_fingerprint as backend_fingerprint
from jaxstale.runs.fingerprint import code_changes as code_changes
from jaxstale.runs.fingerprint import code_fingerprint as code_fingerprint
from jaxstale.runs.fingerprint import code_hash as code_hash
from jaxstale.runs.fingerprint import source_digest as source_digest
from jaxstale.runs.fingerprint import user_source_text as user_source_text
from jaxstale.runs.folder import RESULTS_DIR as RESULTS_DIR
from jaxstale.runs.folder import RunFolder as RunFolder
from jaxstale.runs.folder import RunFolderError as RunFolderError
from jaxstale.runs.folder import StaleResultsError as StaleResultsError
from jaxstale.runs.folder import atomic_write_text as atomic_write_text
from jaxstale.runs.folder import config_hash as config_hash
from jaxstale.runs.folder import to_json as to_json
from jaxstale.runs.plots import add_footer as add_footer
from jaxstale.runs.plots import axis_label as axis_label
from jaxstale.runs.plots import clipped_errorbar as clipped_errorbar
from jaxstale.runs.plots import curves_figure as curves_figure
from jaxstale.runs.plots import finish_figure as finish_figure
from jaxstale.runs.plots import method_style as method_style
from jaxstale.runs.stats import format_ci as format_ci
from jaxstale.runs.stats import format_steps as format_steps
from jaxstale.runs.stats import mean_ci as mean_ci
from jaxstale.runs.stats import paired_difference as paired_difference
from jaxstale.runs.stats import select as select
from jaxstale.runs.stats import time_to_accuracy as time_to_accuracy
from jaxstale.runs.stats import tuned_table as tuned_table
from jaxstale.runs.tables import format_mean_std as format_mean_std
from jaxstale.runs.tables import markdown_table as markdown_table
from jaxstale.runs.tables import mean_std_table as mean_std_table

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
