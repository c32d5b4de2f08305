"""Staleness-mitigation Optax transforms.

Every factory returns an ``optax.GradientTransformationExtraArgs``: chain it before an optimizer
(``optax.chain(dc_asgd(), optax.sgd(0.1, 0.9))``) and pass the staleness information as extra
arguments of ``update`` (``stale_params=...`` or ``staleness=...``). With zero staleness each
reduces bit for bit to the plain optimizer. The outer optimizers of local SGD / DiLoCo
(:mod:`jaxstale.transforms.outer`) take a pseudo-gradient where the others take a gradient.
"""

from jaxstale.transforms.basis_rotation import BasisRotationState as BasisRotationState
from jaxstale.transforms.basis_rotation import basis_rotation as basis_rotation
from jaxstale.transforms.basis_rotation import (
    scale_by_basis_rotation as scale_by_basis_rotation,
)
from jaxstale.transforms.dc_asgd import DCASGDState as DCASGDState
from jaxstale.transforms.dc_asgd import dc_asgd as dc_asgd
from jaxstale.transforms.error_feedback import ErrorFeedbackState as ErrorFeedbackState
from jaxstale.transforms.error_feedback import error_feedback as error_feedback
from jaxstale.transforms.gap_aware import GapAwareState as GapAwareState
from jaxstale.transforms.gap_aware import gap_aware as gap_aware
from jaxstale.transforms.lookahead import MomentumLookaheadState as MomentumLookaheadState
from jaxstale.transforms.lookahead import lookahead_point as lookahead_point
from jaxstale.transforms.lookahead import momentum_lookahead as momentum_lookahead
from jaxstale.transforms.outer import DelayedNesterovState as DelayedNesterovState
from jaxstale.transforms.outer import StalenessWeightState as StalenessWeightState
from jaxstale.transforms.outer import cgad as cgad
from jaxstale.transforms.outer import delayed_nesterov as delayed_nesterov
from jaxstale.transforms.outer import outer_nesterov as outer_nesterov
from jaxstale.transforms.outer import staleness_weight as staleness_weight
from jaxstale.transforms.staleness_aware import StalenessAwareState as StalenessAwareState
from jaxstale.transforms.staleness_aware import StalenessSchedule as StalenessSchedule
from jaxstale.transforms.staleness_aware import StalenessScheduleState as StalenessScheduleState
from jaxstale.transforms.staleness_aware import staleness_aware as staleness_aware
from jaxstale.transforms.staleness_aware import staleness_schedule as staleness_schedule
from jaxstale.transforms.weight_prediction import WeightPredictionState as WeightPredictionState
from jaxstale.transforms.weight_prediction import (
    find_weight_prediction_state as find_weight_prediction_state,
)
from jaxstale.transforms.weight_prediction import predict_weights as predict_weights
from jaxstale.transforms.weight_prediction import weight_prediction as weight_prediction
