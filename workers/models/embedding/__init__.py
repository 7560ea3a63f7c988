"""all-MiniLM-L6-v2 on torch, one concern a module: the encoder (encoder.py), its CUDA
graphs (graphs.py), the batch runtime (runtime.py: packing, launch, finish) and the
warm-up with its memory measurement (warmup.py). The spec is core/models/embedding.py."""
