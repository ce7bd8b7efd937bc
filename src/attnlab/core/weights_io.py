"""Moved to :mod:`attnlab.weights_io`: importing and exporting model weights is not part of the attention core.

``attnlab.core.weights_io`` (and ``from attnlab.core import weights_io``) stays the same module for a release.
"""

import sys

from .. import weights_io

sys.modules[__name__] = weights_io
