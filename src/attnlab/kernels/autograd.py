"""PyTorch autograd for the kernels: gradients flow through attnlab's own backward, never silently lost.

:func:`attnlab.flash_attention` on tensors that require grad runs inside a ``torch.autograd.Function`` whose
backward is :func:`attnlab.kernels.tiled.flash_attention_backward`'s loop (FlashAttention-2's, in O(n) memory), so
``loss.backward()`` fills ``q.grad``, ``k.grad``, ``v.grad`` and ``bias.grad``; the output and ``lse`` are both
differentiable. :func:`attnlab.cached_attention` does the same for the query (the cache holds detached keys and
values: :meth:`attnlab.KVCache.append` refuses tensors that require grad). Double backward is not supported
(``once_differentiable``: PyTorch raises if asked).

torch is imported only here, and only when a tensor that requires grad comes in (with grad mode on).
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import DTypeError

__all__ = ["cached_function", "flash_function", "refuse_grad", "requires_grad", "wants_grad"]


def requires_grad(x: Any) -> bool:
    """``x`` is a PyTorch tensor with ``requires_grad`` (checked without importing torch for anything else)."""
    return type(x).__module__.split(".")[0] == "torch" and bool(getattr(x, "requires_grad", False))


def wants_grad(*xs: Any) -> bool:
    """Some of ``xs`` requires grad and grad mode is on: the result must carry autograd history."""
    if not any(requires_grad(x) for x in xs):
        return False
    import torch

    return torch.is_grad_enabled()


def refuse_grad(where: str, **named: Any) -> None:
    """A :class:`~attnlab.errors.DTypeError` if a tensor in ``named`` requires grad (grad mode on) where the result
    cannot carry autograd history: better an error than gradients that silently stop."""
    needs = [name for name, x in named.items() if requires_grad(x)]
    if needs and wants_grad(*(named[n] for n in needs)):
        listed = ", ".join(needs)
        raise DTypeError(
            f"{listed}: require grad, but {where} gives results without autograd history (no gradient would reach "
            f"{listed}); pass {listed}.detach() or call it under torch.no_grad()"
        )


@functools.cache
def _flash_class() -> Any:
    import torch

    class FlashAttentionFunction(torch.autograd.Function):
        """``(output, lse) = forward(q, k, v, bias, options)``; backward: ``backward(q, k, v, bias, options, output,
        lse, d_out, d_lse)`` (the tiled kernel's loops, passed in by :func:`flash_function`)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, bias: Any, options: Any, passes: Any) -> Any:
            run_forward, run_backward = passes
            q_, k_, v_ = q.detach(), k.detach(), v.detach()
            b_ = None if bias is None else bias.detach()
            output, lse = run_forward(q_, k_, v_, b_, options)
            ctx.options = options
            ctx.run_backward = run_backward
            ctx.save_for_backward(q_, k_, v_, b_, output, lse)
            return output, lse

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, d_out: Any, d_lse: Any) -> Any:
            q, k, v, bias, out, lse = ctx.saved_tensors
            if d_out is None:
                d_out = torch.zeros_like(out)
            g = ctx.run_backward(q, k, v, bias, ctx.options, out, lse, d_out, d_lse)
            need = ctx.needs_input_grad
            grads = []
            for i, (x, dx) in enumerate(((q, g.dq), (k, g.dk), (v, g.dv), (bias, g.dbias))):
                grads.append(dx.to(x.dtype) if need[i] and dx is not None else None)
            return (*grads, None, None)

    return FlashAttentionFunction


def flash_function(q: Any, k: Any, v: Any, bias: Any, options: Any, *, forward: Any, backward: Any) -> tuple[Any, Any]:
    """``(output, lse) = forward(q, k, v, bias, options)`` with autograd history, its backward
    ``backward(q, k, v, bias, options, output, lse, d_out, d_lse)`` (a result with ``dq, dk, dv, dbias``):
    :func:`~attnlab.kernels.tiled.flash_attention` passes its own loops, ``options`` its
    :class:`~attnlab.kernels.tiled.TiledOptions` (this module imports no kernel, so the kernels can import it).
    q, k, v and bias must be PyTorch tensors; a NumPy bias is converted, and gets no gradient."""
    import torch

    libraries = {type(x).__module__.split(".")[0] for x in (q, k, v)}
    if libraries != {"torch"}:
        raise DTypeError(
            "q, k, v: some require grad but not all are PyTorch tensors; pass all three as tensors "
            "(torch.as_tensor(x)) for gradients to flow"
        )
    if bias is not None and not isinstance(bias, torch.Tensor):
        bias = torch.as_tensor(bias, device=q.device)
    output, lse = _flash_class().apply(q, k, v, bias, options, (forward, backward))
    return output, lse


@functools.cache
def _cached_class() -> Any:
    import torch

    class CachedAttentionFunction(torch.autograd.Function):
        """``cached_attention(q, cache)``; backward: ``flash_attention_backward`` per sequence (dq only)."""

        @staticmethod
        def forward(ctx: Any, q: Any, run: Any) -> Any:
            out, saved = run(q.detach())
            ctx.saved = saved
            return out

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, d_out: Any) -> Any:
            dq = ctx.saved.backward(d_out)
            return dq, None

    return CachedAttentionFunction


def cached_function(q: Any, run: Any) -> Any:
    """``run(q)`` -> ``(output, saved)`` with autograd history for ``q``; ``saved.backward(d_out)`` gives ``dq``."""
    return _cached_class().apply(q, run)
