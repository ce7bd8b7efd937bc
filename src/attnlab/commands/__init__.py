"""One module per ``attnlab`` subcommand.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports anything
heavy (matplotlib, torch, rich, transformers) inside ``run`` only, so ``attnlab --help`` stays fast.
"""

#: The subcommands, in the order ``attnlab --help`` lists them (module names in this package).
COMMANDS: tuple[str, ...] = (
    # learn
    "demo",
    "explain",
    "heatmap",
    "lab",
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
)
