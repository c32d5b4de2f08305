"""Flax NNX models written as ordered sequences of blocks, splittable into pipeline stages.

``create(name, input_shape=..., num_classes=...)`` builds one of :data:`MODELS` (an MLP, a
LeNet-5-style CNN, the CIFAR ResNet-20, a 1-D CNN for MNIST-1D) or a model added with
:func:`register_model` (any Flax NNX module; :func:`model_names` lists them all); :func:`split`
cuts a :class:`StagedModel` into parameter-balanced stages sharing its Variables;
:func:`functional` gives the pure ``apply(params, state, x, train)`` form used by the trainers,
emulators and executors.
"""

from jaxstale.models.gpt import gpt as gpt
from jaxstale.models.remat import REMAT as REMAT
from jaxstale.models.remat import remat as remat
from jaxstale.models.remat import remat_stages as remat_stages
from jaxstale.models.staged import Functional as Functional
from jaxstale.models.staged import StagedModel as StagedModel
from jaxstale.models.staged import block_param_counts as block_param_counts
from jaxstale.models.staged import functional as functional
from jaxstale.models.staged import functional_stages as functional_stages
from jaxstale.models.staged import param_count as param_count
from jaxstale.models.staged import split as split
from jaxstale.models.zoo import MODELS as MODELS
from jaxstale.models.zoo import check_logits as check_logits
from jaxstale.models.zoo import cnn as cnn
from jaxstale.models.zoo import cnn1d as cnn1d
from jaxstale.models.zoo import create as create
from jaxstale.models.zoo import mlp as mlp
from jaxstale.models.zoo import model_names as model_names
from jaxstale.models.zoo import register_model as register_model
from jaxstale.models.zoo import registered_builder as registered_builder
from jaxstale.models.zoo import resnet20 as resnet20
