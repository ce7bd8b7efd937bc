"""One module per ``attnlab`` subcommand.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports anything
heavy (matplotlib, torch, rich, transformers) inside ``run`` only, so ``attnlab --help`` stays fast. Every option
has a ``type=`` from :mod:`attnlab.argtypes` that checks its value while parsing; a module may add
``check_args(args)`` for options that must fit together, which :func:`attnlab.cli.main` runs before ``run``.
``run`` checks a range known only once a model or an example is loaded as soon as it is known, before the long
work. Both raise :class:`~attnlab.errors.OptionError` naming the flag; ``main`` prints any
:class:`~attnlab.errors.AttnlabError` as one line and exits with status 2.
"""

__all__ = ["COMMANDS"]

#: The subcommands, in the order ``attnlab --help`` lists them (module names in this package).
COMMANDS: tuple[str, ...] = (
    # learn
    "demo",
    "explain",
    "heatmap",
    "lab",
    "worksheet",
    "train",
    # scale
    "cost",
    "bench",
    "ring",
    # check
    "check",
    "check_model",
    # real models
    "generate",
    "intervene",
    # the shell
    "completion",
)
