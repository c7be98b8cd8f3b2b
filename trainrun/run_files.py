"""The files a run writes into its folder, named once: the run and its loggers write them; the
commands that read finished runs (report, sweep, sample, recipe=auto, MLflow's upload) and the check
that a new run does not start in an earlier run's folder find them by these names."""

CONFIG = "config.yaml"  # the composed config, resolved
METRICS = "metrics.jsonl"  # one row per evaluation
SUMMARY = "summary.json"  # written during the run, final at its end
STEPS = "steps.jsonl"  # one row per optimizer step: where its time went (rank 0)
CHECKPOINTS = "checkpoints"  # a folder of *.pt
AUTO_DECISION = "auto.json"  # what recipe=auto timed, predicted and chose
