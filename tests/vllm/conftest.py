"""Set-up for the vLLM plugin's tests (run by `make test-vllm` in .venv-vllm; skipped where vLLM is absent).

vLLM is told it runs on the CPU platform before it is imported: on a machine without a GPU its default
("unspecified") platform asks for pinned memory, which needs a driver.
"""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def plugin(monkeypatch):
    """specdec_ext's patches installed through the plugin's entry function, removed afterwards."""
    from specdec_ext.integrations import vllm as integration

    monkeypatch.setenv(integration.ENABLE_VARIABLE, "1")
    integration.register()
    assert len(integration.installed()) == 2, integration.installed()
    yield integration
    integration.uninstall()
