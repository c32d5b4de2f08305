"""jaxstale: staleness in distributed training, in JAX.

Optax transforms that mitigate stale gradients and weights (DC-ASGD, Gap-Aware, staleness-aware
learning rates, SpecTrain/NAG weight prediction), an explicit weight-version buffer, single-device
emulators of asynchronous data parallelism and pipelined model parallelism, and ``jax.shard_map``
executors that run the same schedules on a device mesh.
"""

__version__ = "0.1.0"

# --- versions (issue 3) ---
from jaxstale.versions import VersionBuffer as VersionBuffer

# --- transforms (issue 3) ---
from jaxstale.transforms import DCASGDState as DCASGDState
from jaxstale.transforms import GapAwareState as GapAwareState
from jaxstale.transforms import StalenessAwareState as StalenessAwareState
from jaxstale.transforms import StalenessSchedule as StalenessSchedule
from jaxstale.transforms import StalenessScheduleState as StalenessScheduleState
from jaxstale.transforms import WeightPredictionState as WeightPredictionState
from jaxstale.transforms import dc_asgd as dc_asgd
from jaxstale.transforms import find_weight_prediction_state as find_weight_prediction_state
from jaxstale.transforms import gap_aware as gap_aware
from jaxstale.transforms import predict_weights as predict_weights
from jaxstale.transforms import staleness_aware as staleness_aware
from jaxstale.transforms import staleness_schedule as staleness_schedule
from jaxstale.transforms import weight_prediction as weight_prediction

# --- models, data, losses (issue 2) ---
from jaxstale import data as data
from jaxstale import losses as losses
from jaxstale import models as models
from jaxstale.data import register_dataset as register_dataset
from jaxstale.models import register_model as register_model

# --- pipeline schedules and emulator (issue 5) ---
from jaxstale import schedules as schedules
from jaxstale.schedules import Schedule as Schedule
from jaxstale.emulate.pipeline import PipelineEmulator as PipelineEmulator

# --- async data-parallel emulator (issue 4) ---
from jaxstale import delays as delays
from jaxstale.delays import DelaySchedule as DelaySchedule
from jaxstale.emulate.async_dp import AsyncEmulator as AsyncEmulator
from jaxstale.emulate.async_dp import HParams as HParams
from jaxstale.emulate.async_dp import MethodSpec as MethodSpec
from jaxstale.emulate.async_dp import emulate_async as emulate_async
from jaxstale.emulate.async_dp import lr_warmup as lr_warmup
from jaxstale.emulate.async_dp import register_method as register_method

# --- LC-ASGD (issue 7) ---
# the transform is jaxstale.lc_asgd.lc_asgd: a top-level function `lc_asgd` would shadow the
# sub-package (and break `import jaxstale.lc_asgd.step_predictor`)
from jaxstale import lc_asgd as lc_asgd
from jaxstale.lc_asgd import LCASGDState as LCASGDState
from jaxstale.lc_asgd import LossPredictor as LossPredictor
from jaxstale.lc_asgd import StepObservation as StepObservation
from jaxstale.lc_asgd import StepPredictor as StepPredictor
from jaxstale.lc_asgd import ar_loss_predictor as ar_loss_predictor
from jaxstale.lc_asgd import async_bn_update as async_bn_update
from jaxstale.lc_asgd import delay_loss as delay_loss
from jaxstale.lc_asgd import lc_asgd_stats as lc_asgd_stats
from jaxstale.lc_asgd import least_squares_steps as least_squares_steps
from jaxstale.lc_asgd import merge_batch_stats as merge_batch_stats
from jaxstale.lc_asgd import ordinary_bn_update as ordinary_bn_update
from jaxstale.lc_asgd import recompute_batch_stats as recompute_batch_stats
from jaxstale.lc_asgd import rnn_loss_predictor as rnn_loss_predictor

# --- trainer and run folders (issue 2) ---
from jaxstale import runs as runs
from jaxstale import train as train
from jaxstale.runs import RunFolder as RunFolder

# --- mesh executors (issue 6) ---
from jaxstale import parallel as parallel
from jaxstale.parallel import AsyncMeshExecutor as AsyncMeshExecutor
from jaxstale.parallel import MeshPipeline as MeshPipeline
from jaxstale.parallel import PipelineExecutor as PipelineExecutor
from jaxstale.parallel import make_mesh as make_mesh
from jaxstale.parallel import run_async as run_async
from jaxstale.parallel import run_pipeline as run_pipeline
# --- end of exports ---
