"""Generation benchmarks: continuous batching against static batching and a plain
per-request loop, on this CPU (``bench.generation.cpu``) and on a GPU
(``bench.generation.gpu``)."""
