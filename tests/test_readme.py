"""The README's self-contained Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if block.startswith("import torch, specdec_ext")]


def test_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index):
    exec(compile(EXAMPLES[index], f"README example {index}", "exec"), {})
