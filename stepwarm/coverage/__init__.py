"""``stepwarm coverage``: proof that the first real request costs what the second does.

Starts the engine (stepwarm's scenarios through the start-up hook, or vLLM's
warmup alone as the baseline), replays a traffic file through
``LLM.generate``, each request twice, and reports every JIT compile the
detectors saw and each request's first/second latency ratio.

- :mod:`~stepwarm.coverage.traffic`: the traffic file (JSON Lines) and its checks;
- :mod:`~stepwarm.coverage.detectors`: compile detectors (cache scan, Triton hook, vLLM's JIT monitor);
- :mod:`~stepwarm.coverage.startup`: start-up compiles -> vLLM phase or scenario step;
- :mod:`~stepwarm.coverage.replay`: each request twice through ``LLM.generate``;
- :mod:`~stepwarm.coverage.measure`: one measurement, engine start to report;
- :mod:`~stepwarm.coverage.report`: the report, its verdict, JSON and tables;
- :mod:`~stepwarm.coverage.timeline`: the SVG timeline;
- :mod:`~stepwarm.coverage.compare`: baseline and stepwarm, each in its own process, then restarted;
- :mod:`~stepwarm.coverage.attribution`: each start-up compile of stepwarm's: moved, vllm or extra.
"""
