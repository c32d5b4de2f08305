"""LC-ASGD: loss-prediction-based asynchronous SGD.

A step predictor (:mod:`~jaxstale.lc_asgd.step_predictor`) predicts how many updates land before
a worker's gradient; a loss predictor (:mod:`~jaxstale.lc_asgd.loss_predictor`) predicts the
losses of those steps; the compensated gradient (:func:`lc_asgd`, an optax transformation) is
``∇(ℓ_m + λ·ℓ_delay)`` in our reading. These are leaves: the asynchronous family's registry
(:mod:`jaxstale.asyncdp.methods`) builds the ``lc-asgd`` methods from them, and Async-BN (the
server's batch-norm merge) lives with the server, in :mod:`jaxstale.asyncdp.bn`.

References:
    Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
    Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
"""

from jaxstale.lc_asgd.compensation import LCASGDState as LCASGDState
from jaxstale.lc_asgd.compensation import lc_asgd as lc_asgd
from jaxstale.lc_asgd.compensation import lc_asgd_stats as lc_asgd_stats
from jaxstale.lc_asgd.loss_predictor import ARLossState as ARLossState
from jaxstale.lc_asgd.loss_predictor import LossPredictor as LossPredictor
from jaxstale.lc_asgd.loss_predictor import RNNLossState as RNNLossState
from jaxstale.lc_asgd.loss_predictor import ar_loss_predictor as ar_loss_predictor
from jaxstale.lc_asgd.loss_predictor import delay_loss as delay_loss
from jaxstale.lc_asgd.loss_predictor import rnn_loss_predictor as rnn_loss_predictor
from jaxstale.lc_asgd.step_predictor import LeastSquaresStepsState as LeastSquaresStepsState
from jaxstale.lc_asgd.step_predictor import StepObservation as StepObservation
from jaxstale.lc_asgd.step_predictor import StepPredictor as StepPredictor
from jaxstale.lc_asgd.step_predictor import constant_steps as constant_steps
from jaxstale.lc_asgd.step_predictor import last_staleness_steps as last_staleness_steps
from jaxstale.lc_asgd.step_predictor import least_squares_steps as least_squares_steps
