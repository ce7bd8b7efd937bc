"""``attnlab lab``: open the interactive attention lab (a marimo notebook) on 127.0.0.1, offline.

Edit Q, K and V, toggle causal and padding masks, move the temperature and shift sliders, and do the article's
predict-then-reveal experiments. Stop it with Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

NAME = "lab"
HELP = "open the interactive attention lab in your browser (local, offline)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--open", action="store_true", help="open the URL in the default browser")
    parser.add_argument(
        "--edit", action="store_true", help="copy the notebook to ./attnlab_lab.py and open marimo's editor (teachers)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server to start (60)")
    parser.add_argument("--exit-when-ready", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from ..errors import MissingExtraError
    from ..lab.server import start

    try:
        lab = start(args.port, edit=args.edit)
    except MissingExtraError as err:
        sys.stderr.write(f"attnlab lab: error: {err}\n")
        return 1
    with lab:
        try:
            lab.wait_ready(args.timeout)
        except (TimeoutError, RuntimeError) as err:
            sys.stderr.write(f"attnlab lab: error: {err}\n")
            return 1
        sys.stdout.write(f"attnlab lab: serving {lab.notebook.name} at {lab.url}  (Ctrl-C stops it)\n")
        sys.stdout.flush()
        if args.exit_when_ready:
            return 0
        if args.open:
            import webbrowser

            webbrowser.open(lab.url)
        try:
            lab.process.wait()
        except KeyboardInterrupt:
            sys.stdout.write("\nattnlab lab: stopped\n")
            return 0
    return int(lab.process.returncode or 0)
