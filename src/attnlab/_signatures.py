"""One public signature shared by two functions: spelled once, in the function that documents the arguments.

``attention_trace`` takes :func:`scaled_dot_product_attention`'s arguments and ``ring_attention`` takes
:func:`ring_attention_forward`'s: each variant declares that with :func:`same_arguments` instead of repeating the
keyword list (a second copy drifts: a keyword added to one and forgotten in the other).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["same_arguments"]

P = ParamSpec("P")
R = TypeVar("R")


def same_arguments(template: Callable[P, object]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Declare that the decorated function takes ``template``'s arguments.

    The decorated function is called with every argument by name, defaults filled in (a call that does not fit
    ``template``'s signature is a :class:`TypeError` naming the function). ``inspect.signature``, ``help()``, the
    API reference and type checkers (through the ``ParamSpec``) show ``template``'s parameters with the decorated
    function's own return annotation.

    >>> def area(width: float, *, height: float = 1.0) -> float:
    ...     return width * height
    >>> @same_arguments(area)
    ... def perimeter(**sides: float) -> float:
    ...     return 2 * (sides["width"] + sides["height"])
    >>> perimeter(3.0), list(inspect.signature(perimeter).parameters)
    (8.0, ['width', 'height'])
    """
    shared = inspect.signature(template)

    def decorate(fn: Callable[..., R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                bound = shared.bind(*args, **kwargs)
            except TypeError as err:
                raise TypeError(f"{fn.__name__}(): {err}") from None
            bound.apply_defaults()
            return fn(**bound.arguments)

        own = inspect.signature(fn).return_annotation
        call.__signature__ = shared.replace(return_annotation=own)  # type: ignore[attr-defined]  # read by inspect
        del call.__wrapped__  # inspect.signature reads __signature__, not fn's (**arguments) signature
        return call

    return decorate
