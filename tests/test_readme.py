"""The README's examples run, and its demo excerpt is what `attnlab demo` prints."""

import doctest
from pathlib import Path

from attnlab.commands.demo import demo_text

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run():
    result = doctest.testfile(str(README), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


def test_readme_demo_excerpt_is_real():
    text = README.read_text()
    excerpt = text.split("`attnlab demo` prints")[1].split("```")[1].strip("\n")
    assert excerpt in demo_text()


def test_readme_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("python -m pip install . && attnlab demo")
    assert block[1].startswith("bash scripts/test.sh")
    assert "bash scripts/test.sh" in (README.parent / ".ci" / "run").read_text()


def test_readme_check_example_is_real(tmp_path, capsys):
    from attnlab.cli import main

    text = README.read_text()
    part = text.split("For this `examples/my_attention.py`")[1]
    source = part.split("```python\n")[1].split("```")[0]
    shown = part.split("$ attnlab check examples/my_attention.py:attn\n")[1].split("```")[0].strip("\n").splitlines()
    (tmp_path / "my_attention.py").write_text(source)
    assert main(["check", f"{tmp_path / 'my_attention.py'}:attn", "--no-color", "--width", "100"]) == 1
    out = capsys.readouterr().out.splitlines()
    for line in shown:
        assert line in out, line
