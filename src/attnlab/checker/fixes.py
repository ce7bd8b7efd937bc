"""How to fix each finding code, and which codes account for which when they are seen in the same case.

A generic code is *explained* by a named bug seen in the same case (see
:meth:`attnlab.checker.outputs.Outputs.findings`): ``reference-mismatch`` by any diagnosis, the leaks and
``not-normalized`` by the specific mask/softmax/precision diagnoses of :data:`SPECIFIC`.
"""

from __future__ import annotations

__all__ = ["FIXES", "LEAKS", "NOT_DIAGNOSES", "PERTURBATION", "SPECIFIC"]

#: How to fix each bug, in one or two sentences.
FIXES: dict[str, str] = {
    "reference-mismatch": "compute softmax(Q Kᵀ / sqrt(d_k) + mask) V in a precision at least as good as the "
    "inputs'; compare one failing case with attnlab.attention_trace to see which step differs",
    "scale-missing": "multiply Q Kᵀ by 1/sqrt(d_k), where d_k = q.shape[-1] is the per-head key dimension",
    "scale-wrong": "use scale = 1/sqrt(d_k) with d_k the per-head dimension q.shape[-1] (not d_model, not d_v), "
    "and honour a scale argument when one is passed",
    "scale-after-softmax": "multiply the scores by the scale before the softmax (softmax(Q Kᵀ · scale)), and not "
    "the weights or the output after it",
    "softmax-axis": "take the softmax over the last axis (the keys) of [..., h, n_q, n_k] scores: softmax(scores, "
    "axis=-1) / dim=-1, without flattening queries, heads or batch into it",
    "mask-inverted": "convert the mask at the boundary: with True = may attend, fill where ~mask "
    "(masked_fill(~mask, -inf)); attnlab.masks.from_blocked / to_blocked convert between the conventions",
    "mask-after-softmax": "apply the mask to the scores before the softmax (fill -inf where blocked), never "
    "multiply the weights by the mask afterwards; the softmax then renormalizes over the allowed keys",
    "fill-after-softmax": "mask the scores before the softmax (masked_fill(~mask, -inf) on the scores); never write "
    "a fill value into the weights after it",
    "finite-fill": "fill blocked scores with -inf or torch.finfo(dtype).min / np.finfo(dtype).min, never a finite "
    "constant such as -1e4 or -1e9 that scores of that size can exceed",
    "mask-wrong-heads": "expand a per-batch mask [B, 1, n_q, n_k] (or key padding [B, n_k]) to B·h with "
    "repeat_interleave(h, dim=0) when the inputs are flattened batch-major (b·h + head), or keep the head axis and "
    "broadcast: mask[:, None] / rearrange(mask, 'b j -> b 1 1 j')",
    "causal-alignment": "follow the mask (or alignment) you are given; when rebuilding a causal mask for n_q != n_k "
    "use the given alignment: attnlab.masks.causal(n_q, n_k, align=...)",
    "gqa-mapping": "expand K/V heads with the declared mapping: query head i uses K/V head i // (h / h_kv) "
    "(repeat_interleave, HF repeat_kv) or i % h_kv (tile), as the model was trained",
    "causal-leak": "block key j for query i when j > i (+ n_k - n_q for bottom-right alignment), before the "
    "softmax; attnlab.masks.causal(n_q, n_k, align=...) draws the intended mask",
    "padding-leak": "mask the padded keys (columns), not the queries, and apply the mask before the softmax "
    "with -inf or finfo(dtype).min, never a fill value the scores can exceed",
    "masked-row-nan": "give rows with no allowed key a defined value: zeros (as FlashAttention and PyTorch "
    "SDPA), or raise; e.g. where(row has no allowed key, 0, softmax)",
    "unstable-softmax": "subtract the row maximum before exp (stable softmax), and compute exp and the sum in "
    "float32 or better",
    "not-normalized": "divide exp(logits - max) by its row sum over the keys (axis -1) before multiplying by V",
    "batch-leak": "keep batch and head axes separate: use transpose/permute before reshape/view, never reduce (max, "
    "sum, mean) over the batch or head axes, and index K/V with the loop's own batch/head index (k[b], v[b])",
    "nondeterministic": "make the computation order fixed (no random key order, no unseeded dropout at "
    "inference); PyTorch: torch.use_deterministic_algorithms(True)",
    "crash": "make the function accept every input of the supported capabilities, or refuse a capability with "
    "a clear exception on every call (then it is reported as unsupported, not as a bug)",
    "masked-row-policy": "make fully masked rows follow the declared policy (masked_rows=...), or declare the "
    "policy the function has",
    "precision": "compute in the input's precision or better (float32 at least for float32/float64 inputs): do not "
    "cast the weights or Q/K/V to float16/bfloat16, or declare compute_dtype=... when it is documented",
    "dtype": "return the output in the input dtype (cast back after computing in higher precision)",
    "mutates-input": "never write into the caller's arrays: use out-of-place operations (q = q * scale, not "
    "q *= scale / q.mul_())",
    "timeout": "make sure the function returns for every input; the per-call limit is the timeout option",
    "output-type": "return an array of the library the inputs came in (torch.Tensor for tensors, numpy.ndarray for "
    "NumPy arrays), e.g. torch.from_numpy(out) or out.numpy(); never convert the result to another library",
    "mod-mismatch": "make the mod return exactly the claimed mask (compare it with attnlab.masks.causal / window "
    "drawn by attnlab.masks.to_string): q_idx >= kv_idx for top-left causal, kv_idx - q_idx <= n_k - n_q for "
    "bottom-right, q_idx - kv_idx <= left for a window; a score_mod that masks returns the score unchanged where it "
    "keeps it and -inf elsewhere",
}

#: Codes a named bug seen in the same case accounts for (``explained_by``).
LEAKS = ("not-normalized", "padding-leak", "causal-leak", "masked-row-nan", "batch-leak")
#: The specific mask, softmax and precision diagnoses, in order of preference: one seen in the same case explains a
#: leak or ``not-normalized`` (:data:`LEAKS`).
SPECIFIC = (
    "softmax-axis",
    "mask-after-softmax",
    "mask-inverted",
    "fill-after-softmax",
    "finite-fill",
    "mask-wrong-heads",
    "causal-alignment",
    "scale-after-softmax",
    "precision",
)
#: Codes found by changing part of the input and watching the output: a ``nondeterministic`` finding makes them
#: unreliable, so it explains them.
PERTURBATION = ("causal-leak", "padding-leak", "batch-leak")
#: Codes that name no bug of the computation (a crash, a timeout, a wrong dtype...): they never explain a
#: ``reference-mismatch``.
NOT_DIAGNOSES = ("reference-mismatch", "crash", "timeout", "dtype", "mutates-input", "output-type")
