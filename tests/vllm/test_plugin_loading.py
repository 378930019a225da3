"""The plugin as vLLM loads it: the installed entry point, through ``vllm.plugins.load_general_plugins``,
in fresh processes, with and without ``SPECDEC_VLLM=1``."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm.plugins")

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Loads the general plugins as every vLLM process does (twice, then the entry function a third time: vLLM
# may call it repeatedly), and reports which of vLLM's methods are specdec_ext's.
PROBE = r"""
import json, sys
import vllm
if len(sys.argv) > 1:
    vllm.__version__ = sys.argv[1]
from vllm import plugins
from vllm.v1.sample import rejection_sampler as v1
from vllm.v1.worker.gpu.spec_decode import rejection_sampler as v2
originals = (v2.RejectionSampler._verify, v1.RejectionSampler.forward)
plugins.load_general_plugins()
plugins.plugins_loaded = False
plugins.load_general_plugins()
by_loader = [a is not b for a, b in zip(originals, (v2.RejectionSampler._verify, v1.RejectionSampler.forward))]
from specdec_ext.integrations import vllm as integration
integration.register()
now = (v2.RejectionSampler._verify, v1.RejectionSampler.forward)
layers = [getattr(getattr(f, "__specdec_ext_original__", None), "__specdec_ext_original__", None) is not None for f in now]
print("PROBE" + json.dumps({"replaced": by_loader, "after_register": [a is not b for a, b in zip(originals, now)],
                            "double_wrapped": layers, "module": integration.__file__}))
"""


def load(env_changes: dict, *args: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_VLLM", "VLLM_PLUGINS")}
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=600, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("PROBE"))
    return json.loads(line[len("PROBE"):]), done.stdout + done.stderr


def test_without_the_variable_nothing_in_vllm_changes():
    report, log = load({})
    assert report["replaced"] == [False, False] and report["after_register"] == [False, False]
    assert "specdec_ext:" not in log  # not a word from the plugin


def test_with_the_variable_both_runners_verify_through_specdec_ext_once():
    report, log = load({"SPECDEC_VLLM": "1"})
    assert report["replaced"] == [True, True], log
    assert report["double_wrapped"] == [False, False]  # idempotent: three calls, one layer
    assert not report["module"].startswith(os.path.join(REPOSITORY, "specdec_ext"))  # an installed copy, found by its entry point
    assert log.count("now runs through specdec_ext") == 1, log
    assert "RejectionSampler._verify" in log and "RejectionSampler.forward" in log


def test_vllm_plugins_allow_list_without_specdec_ext_keeps_it_out():
    report, _ = load({"SPECDEC_VLLM": "1", "VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert report["replaced"] == [False, False]  # the loader skipped it
    assert report["after_register"] == [True, True]  # the entry function itself still works when called
    report, _ = load({"SPECDEC_VLLM": "1", "VLLM_PLUGINS": "specdec_ext"})
    assert report["replaced"] == [True, True]
    report, _ = load({"SPECDEC_VLLM": "0", "VLLM_PLUGINS": "specdec_ext"})
    assert report["replaced"] == [False, False] and report["after_register"] == [False, False]


def test_an_untested_vllm_version_is_refused_with_a_message():
    report, log = load({"SPECDEC_VLLM": "1"}, "0.34.0")
    assert report["replaced"] == [False, False] and report["after_register"] == [False, False]
    assert "refuses to patch vLLM" in log and "0.34.0 is outside the tested versions 0.33.0" in log, log
