"""vLLM plugin: vLLM's speculative-decoding verification through specdec_ext's fused, exact kernels.

Registered in the ``vllm.general_plugins`` entry-point group (pyproject.toml), so vLLM calls
:func:`register` in every process it starts, possibly more than once. It changes nothing unless the
environment sets ``SPECDEC_VLLM=1``; then, on a tested vLLM version, it replaces

* Model Runner V2 (the default): ``RejectionSampler._verify``, i.e. the ``apply_sampling_params`` +
  ``rejection_sample`` pair (see :mod:`.model_runner_v2`);
* the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``): ``RejectionSampler.forward`` (see :mod:`.model_runner_v1`);

and logs once what it replaced. What specdec_ext does not implement (vLLM's "fly" and "synthetic"
methods, watermarking, adaptive verification, sampling masks, post-temperature custom processors in V1)
goes to vLLM's own code, said once per reason. On another vLLM version it refuses with a warning and
patches nothing.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys

# The vLLM releases these patches were written against and tested with (tests/vllm/).
TESTED_VLLM_VERSIONS = ("0.33.0",)
ENABLE_VARIABLE = "SPECDEC_VLLM"

LOGGER_NAME = "vllm.specdec_ext"  # vLLM's logger hierarchy: messages appear in vLLM's own log output

# (module, class, method, expected parameters) of everything the plugin replaces.
_TARGETS = (
    ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "_verify",
     ("self", "logits", "draft_logits", "draft_sampled", "pos", "cu_num_logits", "idx_mapping", "idx_mapping_np",
      "expanded_idx_mapping", "expanded_local_pos", "seq_lens_upper_bound_np", "verify_draft_sampled")),
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler", "forward",
     ("self", "metadata", "draft_probs", "logits", "sampling_metadata")),
)
_ORIGINAL = "__specdec_ext_original__"
_noted: set[tuple[str, str]] = set()


def register() -> None:
    """The entry point vLLM calls. Idempotent; does nothing unless ``SPECDEC_VLLM=1``."""
    if os.environ.get(ENABLE_VARIABLE) != "1":
        return
    problem = _refusal()
    if problem is not None:
        if ("refused", problem) not in _noted:
            _noted.add(("refused", problem))
            _say(logging.WARNING, f"specdec_ext: {ENABLE_VARIABLE}=1 is set but the plugin refuses to patch vLLM: {problem}. "
                                  "vLLM's own verification stays in use.")
        return
    replaced = [f"{cls.__module__}.{cls.__name__}.{name}" for cls, name, make in _replacements() if _patch(cls, name, make)]
    if replaced:
        _say(logging.INFO, "specdec_ext: speculative-decoding verification now runs through specdec_ext's fused exact kernels (temperature, "
                           "top-k, top-p after vLLM's own penalties, bias, bad words, allowed ids and min-p); replaced " + ", ".join(replaced))


def installed() -> list[str]:
    """The vLLM methods currently replaced by specdec_ext (importable targets only)."""
    return [f"{cls.__module__}.{cls.__name__}.{name}" for cls, name, _ in _replacements() if hasattr(getattr(cls, name), _ORIGINAL)]


def uninstall() -> None:
    """Put vLLM's own methods back and forget what was said (tests; vLLM itself never calls this)."""
    _noted.clear()
    for cls, name, _ in _replacements():
        original = getattr(getattr(cls, name), _ORIGINAL, None)
        if original is not None:
            setattr(cls, name, original)


def _refusal() -> str | None:
    """Why this vLLM cannot be patched safely (None when it can)."""
    try:
        import vllm
        from packaging.version import Version
    except ImportError as exc:
        return f"vLLM is not importable ({exc})"
    version = Version(vllm.__version__)
    if version.base_version not in TESTED_VLLM_VERSIONS or version.is_prerelease or version.is_devrelease:
        return f"vLLM {vllm.__version__} is outside the tested versions {', '.join(TESTED_VLLM_VERSIONS)}"
    for module_name, class_name, method, parameters in _TARGETS:
        try:
            module = __import__(module_name, fromlist=[class_name])
            function = getattr(getattr(module, class_name), method)
        except (ImportError, AttributeError) as exc:
            return f"{module_name}.{class_name}.{method} is missing ({exc})"
        found = tuple(inspect.signature(getattr(function, _ORIGINAL, function)).parameters)
        if found != parameters:
            return f"{module_name}.{class_name}.{method} takes {found}, not the tested {parameters}"
    return None


def _replacements():
    """(class, method name, factory of the replacement from vLLM's original) for both runners."""
    from vllm.v1.sample import rejection_sampler as v1
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as v2

    return ((v2.RejectionSampler, "_verify", _v2_verify), (v1.RejectionSampler, "forward", _v1_forward))


def _patch(cls, name: str, make) -> bool:
    current = getattr(cls, name)
    if hasattr(current, _ORIGINAL):
        return False  # already ours (vLLM may call register() several times per process)
    replacement = make(current)
    setattr(replacement, _ORIGINAL, current)
    setattr(cls, name, replacement)
    return True


def _say(level: int, message: str) -> None:
    """Log on vLLM's logger; straight to stderr where no handler is set up yet (vLLM configures logging when
    its engine starts, and may load plugins before that), so the one message per process is never lost."""
    log = logging.getLogger(LOGGER_NAME)
    if log.hasHandlers():
        log.log(level, message)
    else:
        print(f"{logging.getLevelName(level)} {message}", file=sys.stderr, flush=True)


def _note_passthrough(runner: str, reason: str) -> None:
    if (runner, reason) not in _noted:
        _noted.add((runner, reason))
        _say(logging.INFO, f"specdec_ext: {runner} verification with {reason} is not implemented by specdec_ext; vLLM's own code verifies it")


def _v2_verify(original):
    from . import model_runner_v2

    @functools.wraps(original)
    def _verify(self, *args, **kwargs):
        reason = model_runner_v2.passthrough_reason(self)
        if reason is not None:
            _note_passthrough("Model Runner V2", reason)
            return original(self, *args, **kwargs)
        return model_runner_v2.verify(self, *args, **kwargs)

    return _verify


def _v1_forward(original):
    from . import model_runner_v1

    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        reason = model_runner_v1.passthrough_reason(self, sampling_metadata)
        if reason is not None:
            _note_passthrough("V1 runner", reason)
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        return model_runner_v1.forward(self, metadata, draft_probs, logits, sampling_metadata)

    return forward
