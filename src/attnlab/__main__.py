"""``python -m attnlab`` is the ``attnlab`` command."""

from .cli import main

raise SystemExit(main())
