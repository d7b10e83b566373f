"""Heads on image embeddings: small linear/MLP models scored in the embedding model's actor.

A head takes the L2-normalised image embedding (n, D) float32 already on the device
(``DualEncoder.run``: no second forward pass, no extra transfer) and returns one score
per row, (n,) float32, in float32 whatever the embedding model's dtype (the heads are a
few MB; LAION trained theirs in float32). ``image_embedding.heads`` (``spec.HeadSpec``)
names a preset or a generic head:

* ``laion-aesthetic``: the LAION improved-aesthetic-predictor ("LAION-Aesthetics V2",
  christophschuhmann/improved-aesthetic-predictor ``simple_inference.py``; NeMo Curator
  ``nemo_curator/image/classifiers/aesthetic.py`` copies it): an ``nn.Sequential``
  ``layers`` of Linear(D, 1024), Dropout, Linear(1024, 128), Dropout, Linear(128, 64),
  Dropout, Linear(64, 16), Linear(16, 1), no activations (the published
  ``sac+logos+ava1-l14-linearMSE.pth``), over L2-normalised CLIP ViT-L/14 image embeddings
  (D = 768). Keys ``layers.{0,2,4,6,7}.{weight,bias}``; the score is the raw output
  (roughly 1..10) into ``aesthetic_score``.
* ``laion-nsfw``: LAION-AI/CLIP-based-NSFW-Detector (a Keras model) as NeMo Curator ports
  it to PyTorch (``nemo_curator/image/classifiers/nsfw.py``, weights
  ``clip_autokeras_binary_nsfw.pth``): ``norm`` (buffers ``mean``, ``variance``:
  ``(x - mean) / sqrt(variance)``), ``linear_1`` (D -> 64), ``linear_2`` (64 -> 512),
  ``linear_3`` (512 -> 256), ``linear_4`` (256 -> 1), ReLU between, sigmoid on the output
  (0..1) into ``nsfw_score``; D = 768 (ViT-L/14).
* generic (``name``): ``layers``, an ``nn.Sequential`` of Linear layers (``input_dim`` ->
  ``hidden``... -> ``outputs``) with ``activation`` modules between (keys
  ``layers.{0,2,4,...}``), output ``none``, ``sigmoid`` or ``softmax`` (the probability
  of ``positive_index``) into ``score_<name>``.

Weights (``weights``) are a state dict in a ``.safetensors`` file (``safetensors.torch``)
or a PyTorch pickle (``torch.load(weights_only=True)``: tensors only, no code runs), read
from a local file, a local directory / ``s3://`` prefix holding exactly one weight file,
an ``s3://`` file (copied once per node into the model cache of ``models.weights``), or
``hf://<owner>/<repo>[/<file>]`` (the Hugging Face cache; ``huggingface_hub`` honours
``HF_HUB_OFFLINE``). Heads have no config.json: the architecture comes from the spec and
the weights must match it key for key and shape for shape (``load_state_dict(strict)``).

``check_heads(spec, config)`` runs on the driver in ``registry.check_models``: a head
whose ``embedding_model`` differs from the checkpoint's ``model_type``, or whose
``input_dim`` differs from the embedding size (CLIP ``projection_dim``, SigLIP the vision
``hidden_size``) or from the weights' first layer, fails the job before anything runs
(``ModelLoadError`` naming the head and the model).

Videos: the model step sends every sampled frame; each frame is scored and the row gets
the mean of its frames' scores (``steps.model._pool``, like ``clip_score``), i.e. the mean
frame score, not the score of the pooled clip embedding.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.errors import ModelLoadError
from pipeline.models import weights as model_weights
from pipeline.spec import HeadSpec
from pipeline.storage import fs

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class Normalization(nn.Module):
    """Keras ``Normalization``: ``(x - mean) / sqrt(variance)`` with buffers ``mean`` and
    ``variance`` of shape (D,) (the layout NeMo Curator's NSFW port saves)."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("variance", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.variance.sqrt()


class Sequential(nn.Module):
    """A module whose only child is ``layers`` (keys ``layers.<i>.*``)."""

    def __init__(self, *layers: nn.Module):
        super().__init__()
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class NsfwMlp(nn.Module):
    """The LAION CLIP-based NSFW detector as NeMo Curator ports it (module docstring);
    returns the logit (n, 1), the sigmoid is the head's output transform."""

    def __init__(self, dim: int = 768):
        super().__init__()
        self.norm = Normalization(dim)
        self.linear_1, self.linear_2 = nn.Linear(dim, 64), nn.Linear(64, 512)
        self.linear_3, self.linear_4 = nn.Linear(512, 256), nn.Linear(256, 1)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.linear_1(self.norm(x)))
        x = self.act(self.linear_3(self.act(self.linear_2(x))))
        return self.linear_4(x)


def laion_aesthetic(dim: int = 768) -> Sequential:
    """The improved-aesthetic-predictor MLP (module docstring); Dropout is inert in eval."""
    return Sequential(nn.Linear(dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128),
                      nn.Dropout(0.2), nn.Linear(128, 64), nn.Dropout(0.1),
                      nn.Linear(64, 16), nn.Linear(16, 1))


def generic(spec: HeadSpec) -> Sequential:
    """A generic head: Linear layers ``input_dim -> *hidden -> outputs``, ``activation``
    between them."""
    sizes = [spec.input_dim, *spec.hidden, spec.outputs]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(a, b)] + ([_ACTIVATIONS[spec.activation]()] if i < len(sizes) - 2
                                       else [])
    return Sequential(*layers)


def build_module(spec: HeadSpec) -> nn.Module:
    """The head's ``nn.Module`` with random weights (float32, CPU)."""
    if spec.preset == "laion-aesthetic":
        return laion_aesthetic(spec.input_dim)
    if spec.preset == "laion-nsfw":
        return NsfwMlp(spec.input_dim)
    return generic(spec)


def output_kind(spec: HeadSpec) -> str:
    """``none``, ``sigmoid`` or ``softmax``: how the head's outputs become its score."""
    return {"laion-aesthetic": "none", "laion-nsfw": "sigmoid"}.get(spec.preset, spec.output)


class Head:
    """A loaded head: ``head(embeddings)`` with (n, D) float32 L2-normalised embeddings on
    its device -> (n,) float32 scores there. ``column``: its output column."""

    def __init__(self, spec: HeadSpec, module: nn.Module):
        self.spec, self.column, self.module = spec, spec.column, module.eval()
        self.kind, self.index = output_kind(spec), spec.positive_index

    @torch.inference_mode()
    def __call__(self, embeddings: torch.Tensor) -> torch.Tensor:
        out = self.module(embeddings.float())
        if self.kind == "softmax":
            return out.softmax(dim=-1)[:, self.index]
        out = out[:, 0]
        return out.sigmoid() if self.kind == "sigmoid" else out


def load_head(spec: HeadSpec, device: str, field: str = "image_embedding.heads") -> Head:
    """Fetch ``spec.weights``, load them strictly into the head's module on ``device``.
    Raises ``ModelLoadError`` naming ``field`` and the location if the weights are missing,
    unreadable or do not fit the architecture."""
    module = build_module(spec)
    state = read_state_dict(head_file(spec.weights, field), field, spec.weights)
    _check_fits(module, {k: tuple(v.shape) for k, v in state.items()}, spec, field)
    module.load_state_dict(state, strict=True)
    return Head(spec, module.to(device=device, dtype=torch.float32))


def head_file(location: str, field: str = "weights") -> str:
    """A local path of the head's weight file (see the module docstring for locations).
    Raises ``ModelLoadError`` naming ``field`` and ``location``."""
    try:
        if location.startswith("hf://"):
            path = _hf_file(location.removeprefix("hf://"))
        elif fs.is_local(location):
            path = os.path.abspath(os.path.expanduser(location.removeprefix("file://")))
            if not os.path.exists(path):
                raise ModelLoadError("no such file or directory")
        elif location.endswith(model_weights.WEIGHT_SUFFIXES):
            path = _cached_remote_file(location)
        else:
            path = str(model_weights.mirror_to_cache(location))
        return _one_weight_file(path) if os.path.isdir(path) else path
    except ModelLoadError as e:
        raise ModelLoadError(f"{field} {location!r}: {e}") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{field} {location!r}: cannot read the head: {e}") from e


def _one_weight_file(directory: str) -> str:
    names = sorted(n for n in os.listdir(directory) if n.endswith(model_weights.WEIGHT_SUFFIXES))
    if len(names) != 1:
        raise ModelLoadError(f"the directory holds {len(names)} weight files "
                             f"({', '.join(names) or 'none'}); name the file")
    return os.path.join(directory, names[0])


def _hf_file(rest: str) -> str:
    """``owner/repo/path`` -> that file in the Hugging Face cache; ``owner/repo`` -> the
    snapshot directory (``huggingface_hub``, which honours ``HF_HUB_OFFLINE``)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    parts = rest.split("/")
    if len(parts) < 2:
        raise ModelLoadError("a Hugging Face location is hf://<owner>/<repo>[/<file>]")
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return hf_hub_download(repo_id, filename) if filename else snapshot_download(repo_id)
    except Exception as e:  # offline and not cached, HTTP errors: the library's own types
        raise ModelLoadError(f"Hugging Face {type(e).__name__}: {e}") from e


def _cached_remote_file(uri: str) -> str:
    """One remote weight file copied once per node into the model cache (reused while its
    size is unchanged), under the cache's file lock."""
    from filelock import FileLock

    size = fs.file_size(uri)
    if size is None:
        raise ModelLoadError("no such file")
    dest = model_weights.cache_dir_for(uri) / uri.rsplit("/", 1)[-1]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent) + ".lock", timeout=3600):
        if not (dest.is_file() and dest.stat().st_size == size):
            data = fs.read_bytes(uri)
            fs.write_local_atomic(str(dest), lambda f: f.write(data))
    return str(dest)


def read_state_dict(path: str, field: str, location: str) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or a PyTorch pickle (``weights_only``).
    Raises ``ModelLoadError`` if it does not read as either."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and unpickling raise many types on a bad file
        raise ModelLoadError(f"{field} {location!r}: {Path(path).name} is not a readable "
                             f"state dict: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{field} {location!r}: {Path(path).name} is not a state dict of "
                             "tensors")
    return state


def weight_shapes(path: str, field: str, location: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the head's weights, cheaply: the safetensors header only, or the
    pickle memory-mapped (``torch.load(mmap=True)``, no tensor data read)."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        try:
            with safe_open(path, framework="pt") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        except Exception as e:  # a corrupt header
            raise ModelLoadError(f"{field} {location!r}: {Path(path).name}: {e}") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # not a zip-format pickle: read it whole (heads are small)
        state = read_state_dict(path, field, location)
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _check_fits(module: nn.Module, shapes: dict[str, tuple[int, ...]], spec: HeadSpec,
                field: str) -> None:
    """Raise ``ModelLoadError`` unless ``shapes`` has exactly the module's keys and shapes
    (the first layer's input size is reported against ``input_dim``)."""
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    what = spec.preset or f"{spec.architecture} head"
    missing, extra = sorted(set(want) - set(shapes)), sorted(set(shapes) - set(want))
    if missing or extra:
        raise ModelLoadError(f"{field} {spec.weights!r}: the weights do not fit the {what} "
                             f"architecture: missing keys {missing[:6]}, unexpected keys "
                             f"{extra[:6]}")
    first = next(k for k, s in want.items() if len(s) == 2)
    if shapes[first][1] != want[first][1]:
        raise ModelLoadError(f"{field}: input_dim is {spec.input_dim} but the weights "
                             f"{spec.weights!r} take {shapes[first][1]} inputs ({first} "
                             f"{list(shapes[first])})")
    wrong = [f"{k} {list(shapes[k])} (want {list(s)})" for k, s in want.items() if shapes[k] != s]
    if wrong:
        raise ModelLoadError(f"{field} {spec.weights!r}: shapes do not fit the {what} "
                             f"architecture: {'; '.join(wrong[:4])}")


def embedding_dim(config: dict[str, Any]) -> int | None:
    """The image embedding size of a checkpoint from its config.json (filled with the
    config class's defaults): CLIP ``projection_dim``, SigLIP the vision ``hidden_size``;
    None if neither is known."""
    from transformers import AutoConfig

    data = dict(config)
    try:
        cfg = AutoConfig.for_model(str(data.pop("model_type", "")), **data)
    except (ValueError, KeyError, TypeError):
        return config.get("projection_dim")
    if getattr(cfg, "projection_dim", None):
        return int(cfg.projection_dim)
    vision = getattr(cfg, "vision_config", None)
    return int(vision.hidden_size) if vision is not None else None


def check_heads(spec: Any, config: dict[str, Any], section: str = "image_embedding") -> None:
    """Driver, job start: each head of ``spec`` (an ``ImageEmbedSpec``) expects the
    embedding model and size the checkpoint (``config``, its config.json) has, and its
    weights are there and fit its architecture. Raises ``ModelLoadError`` naming the head,
    the model location and both values. Remote weights are fetched (heads are small)."""
    if not spec.heads:
        return
    model_type, dim = str(config.get("model_type", "")), embedding_dim(config)
    for i, head in enumerate(spec.heads):
        field = f"{section}.heads[{i}] ({head.preset or head.name}, {head.column})"
        if head.embedding_model is not None and head.embedding_model != model_type:
            raise ModelLoadError(f"{field} expects embedding_model {head.embedding_model!r}; "
                                 f"{section}.model {spec.model!r} is model_type {model_type!r}")
        if dim is not None and head.input_dim != dim:
            raise ModelLoadError(f"{field} expects input_dim {head.input_dim}; {section}.model "
                                 f"{spec.model!r} ({model_type}) embeds into {dim} dimensions")
        path = head_file(head.weights, f"{field}.weights")
        _check_fits(build_module(head), weight_shapes(path, field, head.weights), head, field)
