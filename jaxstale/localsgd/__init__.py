"""Local SGD and the DiLoCo family: workers run ``H`` inner steps and exchange pseudo-gradients.

:mod:`~jaxstale.localsgd.schedule` says which worker's job reaches the server when (synchronous
rounds, asynchronous arrivals, dynamic local updates, stragglers: configurations of one
schedule); :mod:`~jaxstale.localsgd.emulator` runs them on one device with any Optax inner
optimizer and any outer optimizer over pseudo-gradients (:mod:`jaxstale.transforms.outer`).
:mod:`~jaxstale.localsgd.streaming` is Streaming DiLoCo (fragments, overlap, α merge);
:mod:`~jaxstale.localsgd.overlap` overlaps a synchronous round's outer exchange (delayed and
eager updates);
:mod:`~jaxstale.localsgd.quantize` the fp8 exchange; :mod:`~jaxstale.localsgd.mesh` runs
synchronous and asynchronous local SGD with each worker on a device of a ``"data"`` axis.
"""

from jaxstale.localsgd.emulator import executor as executor
from jaxstale.localsgd.schedule import LocalSchedule as LocalSchedule
from jaxstale.localsgd.schedule import asynchronous as asynchronous
from jaxstale.localsgd.schedule import synchronous as synchronous
