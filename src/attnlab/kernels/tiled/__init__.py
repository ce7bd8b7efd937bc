"""Tiled online-softmax attention (FlashAttention's algorithm on the CPU), exact and in O(n) extra memory.

The forward never holds an ``[n_q, n_k]`` matrix: the queries are cut into blocks of ``block_q`` rows and the keys
into blocks of ``block_k`` columns. For each query block it keeps, per row, a running maximum ``m_i``, a running
sum ``l_i`` of ``exp(s - m_i)`` and an accumulator ``acc`` of ``exp(s - m_i) V``; each key block updates them::

    S      = (scale · Q_i) K_jᵀ  (+ bias, / temperature)  # [block_q, block_k], masked entries -> -inf
    m_new  = max(m_i, rowmax(S))
    P      = exp(S - m_new)
    l_i    = exp(m_i - m_new) · l_i + rowsum(P)
    acc    = exp(m_i - m_new) · acc + P V_j
    ...
    out    = acc / l_i,   lse = m_i + log(l_i)

This is exact: only the order of the additions differs from the dense computation. Some refinements make it
fast in NumPy, where every element-wise pass over a score block costs about a sixth of its two matrix products:

* scores are rounded exactly as the naive computation rounds them (see :class:`_Units`): only a power of two of
  ``scale / temperature`` is folded into Q (exact), the rest multiplies the product, the running maximum is
  subtracted in nats, and only then is the difference converted for ``exp2`` (about 0.6× the cost of ``exp``) —
  unless ``exp`` measured faster in this process (see :func:`exponential`: NumPy's ``exp2`` is sometimes ~3.5×
  slower for a whole process). Folding all of the factor into Q, in log2 units, cost up to 18× the naive float32
  error at |logits| ~ 1e3-1e4 (issue 12); with numba, the multiplication, the offset and ``exp2`` are one fused pass;
* the row sums of ``P`` come from a matrix-vector product ``P 1`` (a fifth of ``P.sum(axis=1)``, and cheaper than
  a column of ones on ``V``, which makes the second product's width odd);
* when the scores of a query block are bounded (``|scale · q_i · k_j| <= ||scale · q_i|| · max_j ||k_j||``, by
  Cauchy-Schwarz, is small enough that ``exp`` can neither overflow nor lose precision, which holds for typical
  activations), no running maximum is needed at all: each key block is one product, one in-place ``exp2``, one
  product and the matrix-vector product; a masked block is masked *after* ``exp2`` (multiplied by 0/1), because
  NumPy's ``exp2`` takes a scalar slow path on ``-inf`` (measured 6× slower per block). Otherwise the online
  softmax above runs; once every row has a finite ``m_i`` it skips the row-maximum pass and exponentiates
  ``S - m_i`` directly, and a block whose row sums grow past ``2**40`` (``2**200`` in float64) is recomputed
  with the maximum pass. (``m_i`` is always the maximum of scores already seen, so nothing underflows that the
  dense computation would keep.)
* each worker thread keeps its buffers (score block, accumulators) between tasks and calls.

Masks are applied block by block (causal with either alignment or an explicit query offset, sliding windows, key
padding by lengths, packed segments, arbitrary boolean masks); a key block that a query block may not see at all is
skipped, not computed, and one it sees entirely is not masked. An additive ``bias`` is read block by block too (its
largest magnitude joins the bound of the fast path), and ``temperature`` divides the logits, as in the core. The
backward is FlashAttention-2's: recompute ``P`` from the saved ``lse``, ``delta = rowsum(dO ∘ O)``,
``dS = P ∘ (dP - delta)``; on PyTorch tensors that require grad, :func:`flash_attention` runs inside a
``torch.autograd.Function`` whose backward it is (:mod:`attnlab.kernels.autograd`).

Finite inputs whose logits overflow the compute dtype raise :class:`~attnlab.errors.RangeError` (what overflowed,
where, the fix), never NaN: when the Cauchy-Schwarz bound of a query block cannot rule it out (it can for any
realistic input, at no cost), that block's logits are checked for infinities as they are computed. Values of V near
the dtype's limit are divided by a power of two first, so that the unnormalised sums cannot overflow either.

Work is split into tasks (batch·heads × query blocks forward, batch·heads × key blocks backward) run on the cores
by :mod:`attnlab.kernels.threads`, with BLAS pinned to one thread per worker.

The package is split by purpose: :mod:`.plan` (validated inputs, blocks, tasks and each block's mask),
:mod:`.forward` (the forward loop), :mod:`.gradients` (the backward loop), :mod:`.result` (the forward's
result, which the backward takes) and :mod:`.exponentials` (which exponential runs, and how scores become its
argument). The GEMM floor that ``attnlab bench`` compares against lives in
:mod:`attnlab.bench`.
"""

from .exponentials import Exponential, exponential
from .forward import flash_attention
from .gradients import FlashGrads, flash_attention_backward
from .plan import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, TiledOptions
from .result import FlashResult

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "Exponential",
    "FlashGrads",
    "FlashResult",
    "TiledOptions",
    "exponential",
    "flash_attention",
    "flash_attention_backward",
]
