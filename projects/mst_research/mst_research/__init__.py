"""The research kit of mst_mm: the runs, probes, reports and benchmarks behind docs/evidence.md
and docs/benchmarks.md. It uses the plugin (``mst_mm``) and is never imported by it."""
from pathlib import Path

#: The repository this kit belongs to: its configs and tools are the kit's.
REPO = str(Path(__file__).resolve().parents[3])
