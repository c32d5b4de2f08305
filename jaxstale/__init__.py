"""jaxstale: staleness in distributed training, in JAX.

Optax transforms that mitigate stale gradients and weights (DC-ASGD, Gap-Aware, staleness-aware
learning rates, SpecTrain/NAG weight prediction, DiLoCo's outer optimizers), an explicit
weight-version buffer, and three distributed families — asynchronous data parallelism
(:mod:`jaxstale.asyncdp`), pipelined model parallelism (:mod:`jaxstale.pipeline`) and local SGD
/ DiLoCo (:mod:`jaxstale.localsgd`) — each one core run by two executors that its ``make``
builds: a single-device emulator and a ``jax.shard_map`` executor on a device mesh, both driven
by one loop (:mod:`jaxstale.loop`); and asynchronous reinforcement learning's stale policies
with their off-policy corrections (:mod:`jaxstale.rl`).
"""

__version__ = "0.1.0"

# --- versions (issue 3) ---
from jaxstale.versions import VersionBuffer as VersionBuffer
from jaxstale._checks import enable_traced_checks as enable_traced_checks

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

# --- the 2026 fixes of a delayed pipeline: error feedback, basis rotation (issue 52) ---
from jaxstale.transforms import ErrorFeedbackState as ErrorFeedbackState
from jaxstale.transforms import error_feedback as error_feedback
from jaxstale.transforms import BasisRotationState as BasisRotationState
from jaxstale.transforms import basis_rotation as basis_rotation
from jaxstale.transforms import scale_by_basis_rotation as scale_by_basis_rotation

# --- outer optimizers over pseudo-gradients (issue 24) ---
from jaxstale.transforms import DelayedNesterovState as DelayedNesterovState
from jaxstale.transforms import MomentumLookaheadState as MomentumLookaheadState
from jaxstale.transforms import StalenessWeightState as StalenessWeightState
from jaxstale.transforms import cgad as cgad
from jaxstale.transforms import delayed_nesterov as delayed_nesterov
from jaxstale.transforms import lookahead_point as lookahead_point
from jaxstale.transforms import momentum_lookahead as momentum_lookahead
from jaxstale.transforms import outer_nesterov as outer_nesterov
from jaxstale.transforms import staleness_weight as staleness_weight

# --- models, data, losses (issue 2) ---
from jaxstale import data as data
from jaxstale import losses as losses
from jaxstale import models as models
from jaxstale.data import register_dataset as register_dataset
from jaxstale.models import register_model as register_model

# --- the executor protocol and its one driver (issue 12) ---
from jaxstale import loop as loop
from jaxstale.loop import Executor as Executor
from jaxstale.mesh import make_mesh as make_mesh

# --- pipelines: schedules, policies, programs, executors (issues 5, 6, 12) ---
from jaxstale import pipeline as pipeline
from jaxstale import schedules as schedules
from jaxstale.schedules import Schedule as Schedule
from jaxstale.pipeline import POLICIES as POLICIES
from jaxstale.pipeline import Policy as Policy
from jaxstale.pipeline import register_policy as register_policy

# --- asynchronous reinforcement learning: stale policies and their corrections (issue 55) ---
from jaxstale import rl as rl

# --- asynchronous data parallelism: methods, server, executors (issues 4, 6, 12) ---
from jaxstale import asyncdp as asyncdp
from jaxstale import delays as delays
from jaxstale import delayed as delayed
from jaxstale.delays import DelaySchedule as DelaySchedule
from jaxstale.asyncdp import HParams as HParams
from jaxstale.asyncdp import MethodSpec as MethodSpec
from jaxstale.asyncdp import emulate_async as emulate_async
from jaxstale.asyncdp import lr_warmup as lr_warmup
from jaxstale.asyncdp import register_method as register_method
from jaxstale.asyncdp import run_async as run_async
from jaxstale.asyncdp import async_bn_update as async_bn_update
from jaxstale.asyncdp import merge_batch_stats as merge_batch_stats
from jaxstale.asyncdp import ordinary_bn_update as ordinary_bn_update
from jaxstale.asyncdp import recompute_batch_stats as recompute_batch_stats

# --- local SGD and the DiLoCo family: schedules, executors (issues 24, 51) ---
from jaxstale import localsgd as localsgd
from jaxstale.localsgd import LocalSchedule as LocalSchedule

# --- LC-ASGD (issue 7) ---
# the transform is jaxstale.lc_asgd.lc_asgd: a top-level function `lc_asgd` would shadow the
# sub-package (and break `import jaxstale.lc_asgd.step_predictor`)
from jaxstale import lc_asgd as lc_asgd
from jaxstale.lc_asgd import LCASGDState as LCASGDState
from jaxstale.lc_asgd import LossPredictor as LossPredictor
from jaxstale.lc_asgd import StepObservation as StepObservation
from jaxstale.lc_asgd import StepPredictor as StepPredictor
from jaxstale.lc_asgd import ar_loss_predictor as ar_loss_predictor
from jaxstale.lc_asgd import delay_loss as delay_loss
from jaxstale.lc_asgd import lc_asgd_stats as lc_asgd_stats
from jaxstale.lc_asgd import least_squares_steps as least_squares_steps
from jaxstale.lc_asgd import rnn_loss_predictor as rnn_loss_predictor

# --- the synchronous trainer (issue 2); run folders are the lab's: experiments.runs ---
from jaxstale import train as train
# --- end of exports ---
