"""The translation catalogues kept as data (``attnlab/catalogues/*.toml``): every key and text as it was in the
Python tables they replaced, and both lookups (``attnlab.i18n.tr``/``text``, the lab's ``t``) reading them.

``tests/data/i18n_catalogues_0.2.0.json`` holds, per area, each key's SHA-256 (first 16 hex digits) of
``english + "\\0" + chinese``, computed from the Python tables of 0.2.0 (commit a123ce8) and checked equal to the
TOML files when they were written. A key may be added; a key that disappears or whose text changes fails here (after
a deliberate change of a translation, ``PYTHONPATH=src python tests/test_i18n_catalogues.py`` rewrites that file).
"""

import hashlib
import json
from pathlib import Path

import pytest

from attnlab.i18n import MESSAGES, read_catalogue, text, tr

SNAPSHOT_FILE = Path(__file__).parent / "data" / "i18n_catalogues_0.2.0.json"
SNAPSHOT = json.loads(SNAPSHOT_FILE.read_text(encoding="utf-8"))


def _digest(en: str, zh: str) -> str:
    return hashlib.sha256(f"{en}\0{zh}".encode()).hexdigest()[:16]


@pytest.mark.parametrize("area", sorted(SNAPSHOT))
def test_every_key_and_text_as_before(area):
    table = read_catalogue(area)
    missing = sorted(set(SNAPSHOT[area]) - set(table))
    assert not missing, f"{area}: keys gone from catalogues/{area}.toml: {missing}"
    changed = sorted(k for k, d in SNAPSHOT[area].items() if _digest(*table[k]) != d)
    assert not changed, f"{area}: text changed for {changed}"
    assert len(SNAPSHOT[area]) >= {"explain": 306, "attnlab": 83}[area]


def test_the_merged_table_and_the_lookups_read_the_files():
    from attnlab.lab.i18n import t

    tr("label.weights")  # loads every area
    for area in SNAPSHOT:
        for key, (en, zh) in read_catalogue(area).items():
            assert MESSAGES[key] == {"en": en, "zh": zh}, key
    assert tr("label.weights", "zh") == "权重"
    assert tr("cli.error", "zh", prog="attnlab explain", msg="x") == "attnlab explain：错误：x"
    # a message continued over lines in the file is one text, no break and no indentation in it
    note = tr("step.scores.note", "en")
    assert "need not sum to 1" in note and "\n" not in note and "  " not in note
    assert text("zh", "plot.weight") == "权重" and t("zh", "label.weights") == "权重"
    assert t("zh", "reveal") == "揭晓"


if __name__ == "__main__":  # rewrite the snapshot from the TOML files as they are now
    tables = {area: read_catalogue(area) for area in SNAPSHOT}
    snap = {area: {k: _digest(en, zh) for k, (en, zh) in t.items()} for area, t in tables.items()}
    SNAPSHOT_FILE.write_text(json.dumps(snap, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
