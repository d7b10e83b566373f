"""An mmpipe plugin package (see examples/plugin/plugin.yaml and docs/extending.md,
"Extending mmpipe with your own package"): ``ColorfulnessStep`` writes ``colorfulness``;
``JsonlDatasink`` writes chosen columns of the ``ok`` rows as JSON Lines."""

from mmpipe_plugin_example.colorfulness import COLORFULNESS, ColorfulnessStep, colorfulness
from mmpipe_plugin_example.jsonl_sink import JsonlDatasink

__all__ = ["COLORFULNESS", "ColorfulnessStep", "JsonlDatasink", "colorfulness"]
