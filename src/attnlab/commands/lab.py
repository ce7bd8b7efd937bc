"""``attnlab lab``: open the interactive attention lab (a marimo notebook) on 127.0.0.1, offline.

Edit Q, K and V, toggle causal and padding masks, move the temperature and shift sliders, and do the article's
predict-then-reveal experiments. Stop it with Ctrl-C, SIGTERM or SIGHUP (exit status 0): the marimo server always
stops with it, and on Linux it is killed even when this command is killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import sys

from ..argtypes import float_or_text, int_or_text

__all__ = ["add_arguments", "check_args", "run"]

NAME = "lab"
HELP = "open the interactive attention lab in your browser (local, offline)"


def add_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """lab's options, with their help in ``lang`` (the command line's language: :func:`attnlab.i18n.cli_lang`)."""
    from ..i18n import help_for

    h = help_for("help.lab", lang)

    number = None if lang == "en" else "N"
    parser.add_argument("--port", type=int_or_text, default=0, metavar=number, help=h("port"))
    parser.add_argument("--open", action="store_true", help=h("open"))
    parser.add_argument("--edit", action="store_true", help=h("edit"))
    parser.add_argument("--timeout", type=float_or_text, default=60.0, metavar=number, help=h("timeout"))
    parser.add_argument("--item", default=None, metavar="N", help=h("item"))
    parser.add_argument("--class", dest="class_mode", action="store_true", help=h("class"))
    parser.add_argument("--exit-when-ready", action="store_true", help=argparse.SUPPRESS)


def check_args(args: argparse.Namespace) -> None:
    """``--item`` names an item (a number 1-43 or an example name) and ``--class`` comes with it; an
    :class:`~attnlab.errors.OptionError` naming the flag otherwise. Sets ``args.item_key`` (the preset's key)."""
    from ..errors import OptionError
    from ..lab.classmode import item_key

    args.item_key = item_key(args.item) if args.item is not None else ""
    if args.class_mode and not args.item_key:
        raise OptionError("--class: needs --item N (the item whose answer stays hidden until the reveal)")
    if args.edit and args.item_key:
        raise OptionError("--item: applies to the app (attnlab lab), not to --edit")


def _fail(message: object, code: int) -> int:
    sys.stderr.write(f"attnlab lab: error: {message}\n")
    return code


def run(args: argparse.Namespace) -> int:
    """Start the lab (marimo on 127.0.0.1) and serve it until Ctrl-C; returns 0, 1 when it cannot start or marimo
    fails, 2 for an option out of range."""
    from .._process import signals_raise
    from ..errors import MissingExtraError, OptionError
    from ..lab.server import start
    from ..validate import check_float, check_int

    try:
        port = check_int("--port", args.port, minimum=0, maximum=65535)
        timeout = check_float("--timeout", args.timeout, positive=True)
    except OptionError as err:
        return _fail(err, 2)
    with signals_raise():  # SIGTERM, SIGHUP -> Terminated (a KeyboardInterrupt): the server is stopped below
        try:
            lab = start(port, edit=args.edit)
        except (MissingExtraError, OSError) as err:
            return _fail(err.strerror if isinstance(err, OSError) and err.strerror else err, 1)
        except KeyboardInterrupt:
            return 0
        try:
            lab.wait_ready(timeout)
            what = "editing" if args.edit else "serving"
            url = lab.url
            key = getattr(args, "item_key", "")
            if key:
                from ..lab.classmode import class_query

                url += class_query(key, hidden=args.class_mode)
            sys.stdout.write(f"attnlab lab: {what} {lab.notebook.name} at {url}  (Ctrl-C stops it)\n")
            sys.stdout.flush()
            if args.exit_when_ready:
                return 0
            if args.open:
                import webbrowser

                webbrowser.open(url)
            code = lab.process.wait()
            return _fail(f"marimo exited with code {code}:\n{lab.output()}", 1) if code else 0
        except (TimeoutError, RuntimeError) as err:
            return _fail(err, 1)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: the usual way to end a server, so exit 0
            sys.stdout.write(f"\nattnlab lab: {str(stop) or 'stopped'}\n")
            return 0
        finally:
            lab.stop()
