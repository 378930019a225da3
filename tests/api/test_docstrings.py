"""The examples in the public API's docstrings run and print what they say."""

from __future__ import annotations

import doctest

import pytest

from specdec_ext import _results, api, prepared


@pytest.mark.parametrize("module", [api, prepared, _results], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, raise_on_error=False, verbose=False)
    assert result.attempted > 0, f"{module.__name__} has no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {module.__name__} failed (see the output above)"
