"""The ``attnlab`` command: parse, call library functions that return data, print.

Each subcommand lives in its own module of :mod:`attnlab.commands`; this file only wires them together.

Exit status: 0 on success (for ``check`` and ``check-model``: no bug found), 1 when ``check``/``check-model`` find a
bug, 2 for a usage error; ``check`` also exits 3 when a core probe could not run and 4 when the checker itself failed
(:class:`attnlab.checker.ExitStatus`). A usage error is one line on stderr, ``attnlab COMMAND: error: --flag: what was
expected, got what``: a bad value (checked by the option's ``type=`` before anything runs), options that do not
fit together (the command's ``check_args(args)``, also before anything runs), a value outside a range that is
only known once a model or an example is loaded, or an :class:`~attnlab.errors.AttnlabError` raised by the work
itself. Any other exception is a bug in attnlab and keeps its traceback.

Standard output closed (``attnlab cost 8 >&-``) is one line on stderr and status 2 before anything runs; a reader
that goes away (``attnlab cost 8 16 | head -0``, a broken pipe) ends the command quietly with status 1, as
Python's documentation of ``SIGPIPE`` recommends. Colour follows ``--no-color``, then ``NO_COLOR``, then
``FORCE_COLOR``, then whether the stream is a terminal (:func:`attnlab.commands.terminal.use_color`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .commands.parser import build_parser
from .commands.terminal import stdout_gone
from .errors import AttnlabError, one_line

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status (see the module)."""
    if sys.stdout is None:  # the process was started with standard output closed (``>&-``)
        if sys.stderr is not None:
            sys.stderr.write("attnlab: error: standard output is closed; redirect it to a file or /dev/null\n")
        return 2
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (``| head -0``): stop quietly
        stdout_gone()
        return 1


def _main(argv: Sequence[str] | None) -> int:
    from .i18n import cli_lang

    parser, modules, parsers = build_parser(cli_lang(sys.argv[1:] if argv is None else argv))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            (parsers[args.command] if args.command else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    mod = modules[args.command]
    try:
        check_args = getattr(mod, "check_args", None)
        if check_args is not None:
            check_args(args)
        status = mod.run(args)
        sys.stdout.flush()  # a broken pipe shows here, not in the interpreter's flush at exit
        return status
    except AttnlabError as err:
        from .i18n import error_message, tr

        sys.stdout.flush()
        lang = getattr(args, "lang", "en")  # a command with --lang: its errors in that language
        msg = one_line(error_message(err, lang)) if lang != "en" else one_line(err)
        sys.stderr.write(tr("cli.error", lang, prog=f"attnlab {mod.NAME}", msg=msg) + "\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
