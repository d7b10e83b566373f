"""mmpipe: a streaming multimodal ETL service on Ray.

The import package is ``pipeline``; the console script is ``mmpipe``. See DESIGN.md
(architecture) and README.md (how to run). Import direction:
``cli -> runtime -> {io, steps, models} -> spec -> {records, errors}``.
"""

__version__ = "0.1.0"
