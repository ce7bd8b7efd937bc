"""One module per ``attnlab`` subcommand.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports anything
heavy (matplotlib, torch, rich, transformers) inside ``run`` only, so ``attnlab --help`` stays fast.
"""

#: The subcommands, in the order ``attnlab --help`` lists them (module names in this package).
COMMANDS: tuple[str, ...] = (
    "demo",
    "explain",
    "heatmap",
    "lab",
    "ring",
    "train",
    "cost",
    "bench",
    "check",
    "check_model",
    "generate",
    "intervene",
)
