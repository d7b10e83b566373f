"""Dataset-wide deduplication without moving records.

At commit every partition writes small hash index files of its ok rows, split into
hash-range buckets (``index``: ``_index/<kind>/b-<bucket>/<pid>.a-<attempt>.parquet``,
named by the partition's commit marker). The dedup pass (``pipeline.runtime.dedup_pass``)
gives each actor whole buckets: it reads only those buckets' index rows, finds duplicate
pairs (``pairs``: exact sha256, near pHash by block bucketing, semantic by cosine within a
k-means cluster with ``semantic``), and commits them per bucket (``store``). A small union
step (``groups``) turns the pairs into groups and keeps the first row in plan order of
each. The result is a ``duplicates`` table; the data files are never rewritten.
"""
