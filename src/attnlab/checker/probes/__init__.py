"""The probes: small named experiments on the function under test, each diagnosing one class of bug by its code.

Every probe builds canonical cases (float64 NumPy, heads before the sequence axis, True = may attend), calls the
function through its session (:class:`~attnlab.checker.session.Session`) and compares with the session strategy's
float64 reference under the tolerance rule of :mod:`attnlab.checker.tolerance`. When an output is wrong, the
diagnosis (:mod:`attnlab.checker.diagnose`) tests hypotheses (scale missing, softmax over the wrong axis, mask
inverted, ...) and names the one that explains it. A probe is a function ``probe(session)`` registered by its name
(:func:`attnlab.checker.registry.probe`), a few per file, grouped by what they probe: :mod:`.reference`,
:mod:`.causal`, :mod:`.padding`, :mod:`.masked_rows`, :mod:`.precision`, :mod:`.batch` (batch/heads and
determinism), and the gradient probes of ``check(fn, backward=...)`` and ``check_backward`` in :mod:`.gradients`
and :mod:`.grad_masking` (``grad-reference``, ``grad-masked-keys``, ``grad-masked-rows``, ``grad-batch``,
``grad-dropout``: see :mod:`attnlab.checker.gradient_oracle`).

The probes, in the order they run (``probes=`` selects a subset):

========================  ===========================================================================  ===========
probe                     experiment                                                                   needs
========================  ===========================================================================  ===========
``reference``             a grid of shapes (n_q != n_k, d_v != d_k, odd sizes, rank 2-4, GQA, B and h  --
                          above 1) and dtypes, compared with the float64 reference; mismatches are
                          diagnosed by the hypotheses of :mod:`attnlab.checker.hypotheses`
``invariants``            the §21 invariants on returned weights (rows sum to 1, masked weights 0)     weights
``normalization``         V = ones: every output must be exactly a convex combination, i.e. 1          --
``causal``                change future tokens; earlier outputs must not move                          causal
``padding``               1e10 / random / NaN in the K and V of padded keys, and scores of large       mask
                          magnitude (a finite fill leaks); valid outputs must not move
``masked-rows``           a query row with no allowed key: error, zeros, uniform (documented) or NaN   mask
``large-logits``          logits of about ±1000: exp overflows or underflows unless the row maximum    --
                          is subtracted
``batch``                 change batch element 1, then 0, then head 1, then 0; the others must not     --
                          move
``determinism``           the same call three times; outputs must be bitwise equal                     --
``call-order``            A, B (one shape), C, D (another), A again: no state carried between calls    --
``mask-space``            padding anywhere, per batch element and head, masks passed broadcast         mask
``decode``                n_q = 1 with key padding, then with padding and causal                       mask/causal
``mods``                  a declared flex ``mask_mod`` / ``score_mod`` against the rule it ``claims``  mask_mod=
========================  ===========================================================================  ===========

``crash``, ``timeout``, ``dtype`` (output dtype = input dtype), ``output-type`` (an array of the function's own
library) and ``mutates-input`` are checked on every call.

Every bug a probe sees is an observation tied to its *case* (one grid case, or one perturbation experiment: its
base call, the repeated base call and the perturbed calls). A generic code is "explained" only by a named bug
seen in the same case; a probe that saw any bug is ``failed`` and lists the codes it saw.
"""

from __future__ import annotations

from ..fixes import FIXES
from ..registry import ProbeAbort, ProbeSkip, ordered, probe
from ..report import GRAD_PROBES, PROBES
from . import batch, causal, grad_masking, gradients, masked_rows, mods, padding, precision, reference, space

__all__ = ["FIXES", "GRAD_PROBE_FUNCTIONS", "PROBE_FUNCTIONS", "ProbeAbort", "ProbeSkip", "probe"]

#: The output probes by name, in the order they run: ``name -> probe(session)``.
PROBE_FUNCTIONS = ordered(PROBES)
#: The gradient probes by name, in the order they run.
GRAD_PROBE_FUNCTIONS = ordered(GRAD_PROBES)
#: The modules that define them (imported for their registrations).
MODULES = (reference, causal, padding, masked_rows, precision, batch, space, mods, gradients, grad_masking)
