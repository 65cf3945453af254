"""Benchmark: first-image latency with and without the vision-encoder prewarm.

Starts a multimodal zoo model in this process (``--model``, default
``tiny-paligemma``), optionally runs stepwarm's ``vision-encoder`` scenario
(``--prewarm``), then times ``LLM.generate`` requests of one image each, one
request at a time: the first image request is what a user pays after
start-up; the next ones show the steady state. Every image is a new one (a
different colour, so no processor or encoder cache hit), at the size of the
processor's largest image class. Run it twice, once per mode, in fresh
processes (the comparison needs cold workers):

    python benchmarks/first_image.py --model tiny-qwen2-vl [--prewarm] [--requests 4]

Prints one JSON line: start-up s, prewarm ms, per-request ms.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen2-vl")
    ap.add_argument("--prewarm", action="store_true", help="run the vision-encoder scenario first")
    ap.add_argument("--requests", type=int, default=4)
    args = ap.parse_args()

    from PIL import Image

    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for

    t0 = time.perf_counter()
    engine = start_engine(args.model)
    startup_s = time.perf_counter() - t0
    profile = read_profile(engine.view)
    prewarm_ms = None
    if args.prewarm:
        report = drive(engine.view, plans_for(["vision-encoder"], profile)[0], profile)
        prewarm_ms = report.wall_ms
    from vllm import SamplingParams

    processor = engine.view.mm_processor
    text = processor.dummy_inputs.get_dummy_text({"image": 1})
    side = profile.image_classes[-1].side
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    latencies = []
    for i in range(args.requests):
        image = Image.new("RGB", (side, side), color=(10 * i, 255 - 10 * i, 128))
        t = time.perf_counter()
        engine.llm.generate({"prompt": text + " t5 t6", "multi_modal_data": {"image": image}},
                            params, use_tqdm=False)
        latencies.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({"model": args.model, "prewarm": args.prewarm, "startup_s": startup_s,
                      "prewarm_ms": prewarm_ms, "image_classes": [c.model_dump() for c in
                                                                  profile.image_classes],
                      "request_ms": latencies}))


if __name__ == "__main__":
    main()
