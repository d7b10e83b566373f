"""Loading a checkpoint's processor, and counting the frame windows a backend is sent.

``load_processor(model_dir)`` is ``AutoProcessor.from_pretrained``. Processors of video
VLMs (Qwen2-VL, Qwen2.5-VL) also hold a video processor, which transformers builds only
with torchvision; without it (this project's CPU install: torchvision is the ``gpu``
extra) the same processor class is built from the checkpoint's image processor, tokenizer
and chat template with no video processor. Everything the backends use (images in a chat
turn, the token expansion, ``mm_token_type_ids``) is then the library's own code; only
``videos=`` is unavailable, and mmpipe never passes it.

``FrameWindows`` counts the rows that reached a backend with a window of several frames
and the frames in them (``ModelBackend.media_stats``, so the job report's
``model_actors`` show what each replica was given).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from pipeline.errors import ModelLoadError


def load_processor(model_dir: str) -> Any:
    """The processor of the checkpoint in ``model_dir`` (see the module docstring).

    Raises ``ModelLoadError`` when the processor needs torchvision for a part mmpipe
    uses (its image processor or tokenizer) or names no class transformers knows."""
    import transformers
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_dir)
    except ImportError as e:
        if "torchvision" not in str(e).lower():
            raise
        name = _processor_class(model_dir)
        cls = getattr(transformers, name or "", None)
        if cls is None or "video_processor" not in cls.get_attributes():
            raise ModelLoadError(f"{model_dir}: processor {name!r} needs torchvision ({e})") from e
        return processor_without_video(cls)(**_parts(model_dir))


def _processor_class(model_dir: str) -> str | None:
    """``processor_class`` from the checkpoint's processor or tokenizer config."""
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                found = json.load(f).get("processor_class")
            if found:
                return found
    return None


def _parts(model_dir: str) -> dict[str, Any]:
    from transformers import AutoImageProcessor, AutoTokenizer

    template = os.path.join(model_dir, "chat_template.jinja")
    chat_template = None
    if os.path.isfile(template):
        with open(template) as f:
            chat_template = f.read()
    return {"image_processor": AutoImageProcessor.from_pretrained(model_dir),
            "tokenizer": AutoTokenizer.from_pretrained(model_dir), "video_processor": None,
            "chat_template": chat_template}


def processor_without_video(cls: type) -> type:
    """A subclass of the processor class ``cls`` that accepts ``video_processor=None``
    (transformers' argument check looks up the video processor's base class, which does
    not exist without torchvision). Its calls with ``images=``/``text=`` are ``cls``'s."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return cls.check_argument_for_proper_class(self, argument_name, argument)

    return type(cls.__name__, (cls,), {"check_argument_for_proper_class":
                                       check_argument_for_proper_class})


class FrameWindows:
    """Counters of multi-frame inputs: ``frame_windows`` (rows sent as a window of frames)
    and ``window_frames`` (frames in those windows)."""

    def __init__(self) -> None:
        self.windows = 0
        self.frames = 0

    def add(self, pixels: np.ndarray) -> None:
        """Count a batch of windows, ``pixels`` (n, F, H, W, 3); other shapes count nothing."""
        if pixels.ndim == 5:
            self.windows += int(pixels.shape[0])
            self.frames += int(pixels.shape[0] * pixels.shape[1])

    def stats(self) -> dict[str, int]:
        return {"frame_windows": self.windows, "window_frames": self.frames}
