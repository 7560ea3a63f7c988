"""Where the worker's host time per packed batch goes (issue 7, item 2): cProfile of
``EmbeddingModel.launch``/``finish`` on 1,024 mixed-length tokenized inputs, two in
flight as the worker runs them, on the GPU this runs on.

    GRISTMILL_EMBED_MODEL_DIR=.modelcache/all-minilm-l6-v2 \\
        python3 bench/gpu/launch_profile.py --out $OUT/launch_profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from core.config import Settings

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=Settings().embed_model_dir)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--out", default="launch_profile.txt")
    args = ap.parse_args()
    sys.argv = sys.argv[:1]
    from bench.gpu.worker_path import make_workload
    from core.models.embedding import EmbedSpec
    from core.models.token_ids import is_tokenized
    from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime

    w = make_workload(args.model_dir, 4096, 8, 128, 256)
    ids = [x["ids"] for x in w["inputs"] if is_tokenized(x)]
    spec = EmbedSpec(name="all-minilm-l6-v2", version="1", max_batch_size=1024, max_tokens=256)
    model = EmbeddingModel(spec, EmbedRuntime(model_dir=args.model_dir))
    model.warmup()
    batches = [ids[(i * 1024) % 3072 : (i * 1024) % 3072 + 1024] for i in range(args.batches)]
    params = {"normalize": True}

    def loop() -> float:
        t0 = time.perf_counter()
        prev = model.launch(batches[0], params, token_ids=True)
        for b in batches[1:]:
            nxt = model.launch(b, params, token_ids=True)
            model.finish(prev)
            prev = nxt
        model.finish(prev)
        return time.perf_counter() - t0

    loop()
    plain = loop()
    prof = cProfile.Profile()
    prof.enable()
    profiled = loop()
    prof.disable()
    buf = io.StringIO()
    buf.write(
        f"{args.batches} batches of 1024, two in flight: {plain * 1e3 / args.batches:.2f} ms "
        f"per batch ({args.batches * 1024 / plain:.0f} items/s); profiled "
        f"{profiled * 1e3 / args.batches:.2f} ms\n"
    )
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    Path(args.out).write_text(buf.getvalue())
    print(buf.getvalue())


if __name__ == "__main__":
    main()
