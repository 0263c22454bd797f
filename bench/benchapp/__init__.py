"""The benchmark's operator for this project: one ``BenchItem`` reconciler (bench only)."""
