"""The interactive lab (extra ``lab``): a marimo notebook shipped inside the package, opened by ``attnlab lab``.

:mod:`attnlab.lab.logic` holds what the notebook computes (plain functions, tested without a browser), with
:mod:`~attnlab.lab.svg` (the pictures), :mod:`~attnlab.lab.predict` (locked predictions and the score),
:mod:`~attnlab.lab.presets` (one preset per article item), :mod:`~attnlab.lab.live` (the live model) and
:mod:`~attnlab.lab.i18n` (the lab's Chinese words); :mod:`attnlab.lab.server` starts marimo on 127.0.0.1, on a free
port, offline. marimo is imported only there and in the notebook.
"""

from pathlib import Path

__all__ = ["NOTEBOOK"]

#: The notebook file (marimo runs it as an app; ``python NOTEBOOK`` runs it as a script).
NOTEBOOK = Path(__file__).with_name("notebook.py")
