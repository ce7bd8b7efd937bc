"""Moved to :mod:`attnlab.weights_io`: importing and exporting model weights is not part of the attention core.

``from attnlab.core import weights_io`` keeps working for a release: this module re-exports every public name of
:mod:`attnlab.weights_io` (the same functions and classes).
"""

from ..weights_io import *  # noqa: F403  # the re-export is the point of this module
from ..weights_io import __all__  # noqa: F401  # the same public names
