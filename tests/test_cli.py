"""The real CLI in a subprocess: composition, flags, help, and every bad input failing cleanly."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import TINY, read_metrics, run_cli, run_here

from trainrun.config import check, config_dir, locate, translate
from trainrun.errors import ConfigError


def test_composer_flags_become_hydra_overrides():
    hydra_args, overrides, debug = translate(
        [
            "--algorithms",
            "channels_last",
            "ema",
            "--precision",
            "amp",
            "--optimizer.lr",
            "0.4",
            "--max_duration=5ep",
            "recipe=baseline",
            "--cfg",
            "job",
            "-m",
            "--debug",
            "--progress",
        ]
    )
    assert hydra_args == ["--cfg", "job", "-m"] and debug
    assert overrides == [
        "algorithms=[channels_last,ema]",
        "precision=amp",
        "optimizer.lr=0.4",
        "max_duration=5ep",
        "recipe=baseline",
        "progress=true",
    ]
    assert translate(["--algorithms", "ema"])[1] == ["algorithms=[ema]"]
    assert translate(["--optimizer.lr", "-0.5"])[1] == ["optimizer.lr=-0.5"]


def test_flags_and_overrides_compose_the_same_config():
    by_flag = check(translate(["--algorithms", "ema", "blurpool", "--optimizer.lr", "0.4"])[1])[0]
    by_override = check(["algorithms=[ema,blurpool]", "optimizer.lr=0.4"])[0]
    assert by_flag == by_override
    assert set(by_flag.algorithms) == {"ema", "blurpool"} and by_flag.optimizer.lr == 0.4


def test_a_recipes_methods_change_by_the_whole_list_or_by_removal():
    """With a recipe, ``algorithms=[...]`` is the run's whole list (one that leaves out a method the
    recipe's body sets is refused: BAD_INPUTS); ``~algorithms.NAME`` removes a method the recipe sets."""
    mild = ["blurpool", "channels_last", "ema", "label_smoothing", "progressive_resizing"]
    added = check(["recipe=mild", "data=digits", f"algorithms=[{','.join(mild)},mixup]"], files=False)[0]
    assert sorted(added.algorithms) == sorted([*mild, "mixup"])
    kept = "algorithms=[blurpool,ema,label_smoothing,progressive_resizing]"
    dropped = check(["recipe=mild", "data=digits", kept], files=False)
    assert "channels_last" not in dropped[0].algorithms  # a method the body does not set goes with the list
    removed = check(["recipe=mild", "data=digits", "~algorithms.label_smoothing"], files=False)[0]
    assert sorted(removed.algorithms) == sorted(set(mild) - {"label_smoothing"})


def test_recipe_group_lives_in_top_level_recipes(tmp_path):
    config = check(["recipe=baseline", "data=folder", f"data.path={tmp_path}"])[0]
    assert config.model.name == "resnet50" and config.optimizer.lr == 2.048
    assert config.scheduler.t_warmup == "8ep" and config.train_batch_size == 2048
    override = check(["recipe=baseline", "data=folder", f"data.path={tmp_path}", "model=resnet18", "optimizer.lr=0.1"])[
        0
    ]
    assert override.model.name == "resnet18" and override.optimizer.lr == 0.1


def test_multirun_sweeps_are_validated_job_by_job():
    assert [c.optimizer.lr for c in check(["optimizer.lr=0.1,0.2"], multirun=True)] == [0.1, 0.2]
    with pytest.raises(ConfigError, match="optimizer.lr"):
        check(["optimizer.lr=0.1,-1"], multirun=True)


def test_help_lists_groups_and_options(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for line in (
        "algorithms: alibi, blurpool, channels_last, colout, cutmix, ema, fixres, fused_layers, "
        "gated_linear_units, ghost_batchnorm, gradient_clipping, label_smoothing, layer_freezing, "
        "low_precision_layernorm, masked_head",
        "model: bert_base, bert_large, bert_mini, bert_tiny, gpt, gpt125, gpt_tiny, llama, llama3_1b, llama3_8b, "
        "llama_tiny, module, resnet101, resnet18, resnet34, resnet50, resnet_small, timm, transformers",
        "recipe: baseline, bert_base, bert_large, bert_large_lamb, gpt125, gpt125_mosaic, gpt2_finetune, gpt_speedrun, "
        "hot, llama31_8b, llama32_1b_continue, medium, mild, unet3d_brats, unet_brats",
        "parallel: ddp, fsdp",
        "scheduler: constant, cosine, linear, mlperf_bert_multistep, multistep, poly, step, wsd",
        "data: decathlon, digits, digits_ffcv, folder, imagenet_ffcv, mnist5k, mnist5k_ffcv, stdlib_docs, "
        "stdlib_stream, synthetic, synthetic_brats, synthetic_ffcv, text, token_mix, token_shards, token_stream",
        "task: causal_lm, image_classification, masked_lm, segmentation",
    ):
        assert line in result.stdout


def test_cfg_job_prints_the_composed_config(tmp_path):
    result = run_cli("--cfg", "job", "--algorithms", "ema", "--optimizer.lr", "0.4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "half_life: 100ba" in result.stdout and "lr: 0.4" in result.stdout
    assert not (tmp_path / "runs").exists()


def test_printing_a_recipe_needs_none_of_its_data_files(tmp_path):
    """``--cfg job recipe=mild`` prints the recipe; training it still checks its .beton files first."""
    printed = run_cli("--cfg", "job", "recipe=mild", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "name: mild" in printed.stdout and "half_life: 100ba" in printed.stdout
    run = run_cli("recipe=mild", cwd=tmp_path)
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        == "trainrun: error: data=beton needs 'data.train' (a .beton file written by 'trainrun write')"
    )
    assert not (tmp_path / "runs").exists()


MY_RECIPE = """# @package _global_
defaults:
  - override /data: digits
  - override /algorithms: [ema]
name: quick
max_duration: 1ep
optimizer:
  lr: 0.3
"""


def test_own_recipes_and_configs_from_a_folder_or_a_path(tmp_path):
    """Hydra's --config-dir/-cd, --config-path/-cp, --config-name/-cn, and a recipe file by path."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "quick.yaml").write_text(MY_RECIPE)
    no_header = MY_RECIPE.replace("# @package _global_\n", "").replace("quick", "loose")
    (tmp_path / "loose.yaml").write_text(no_header)  # read as _global_, like the shipped recipes
    (tmp_path / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\nname: mine\nmax_duration: 3ep\n")
    for argv in (["-cd", str(tmp_path), "recipe=quick"], [f"--config-dir={tmp_path}", "recipe=quick"]):
        source, hydra_args, overrides = locate(*translate(argv)[:2])
        (config,) = check(overrides, source=source)
        assert hydra_args == [] and (config.name, config.max_duration, config.optimizer.lr) == ("quick", "1ep", 0.3)
        assert config.data.name == "digits" and list(config.algorithms) == ["ema"]
        assert config.optimizer.momentum == check([])[0].optimizer.momentum  # the rest is trainrun's defaults
    source, _, overrides = locate([], [f"recipe={tmp_path / 'loose.yaml'}", "optimizer.lr=0.5"])
    (config,) = check(overrides, source=source)
    assert (config.name, config.optimizer.lr, list(config.algorithms)) == ("loose", 0.5, ["ema"])
    for flags in (["-cd", str(tmp_path), "-cn", "mine"], ["-cp", str(tmp_path), "--config-name", "mine.yaml"]):
        source, _, overrides = locate(flags, [])
        assert check(overrides, source=source)[0].max_duration == "3ep"
    refused = r"unknown option 'nosuch' for 'recipe' \(choose from: .*mild, quick, unet3d_brats, unet_brats\)"
    with pytest.raises(ConfigError, match=refused):
        source, _, overrides = locate(["-cd", str(tmp_path)], ["recipe=nosuch"])
        check(overrides, source=source)
    printed = run_cli("-cd", ".", "recipe=quick", "--info", "searchpath", cwd=tmp_path)
    assert printed.returncode == 0 and f"file://{tmp_path}" in printed.stdout, printed.stderr


def test_a_users_recipe_named_like_a_packaged_one_is_the_one_read_and_said_so(tmp_path, capsys):
    """``recipe/mild.yaml`` in --config-dir (or given by path) wins over trainrun's own mild, as a
    user expects; one line on stderr names both files."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "mild.yaml").write_text(MY_RECIPE.replace("quick", "my_mild"))
    source, _, overrides = locate(["-cd", str(tmp_path)], ["recipe=mild"])
    (config,) = check(overrides, source=source)
    assert (config.name, config.max_duration, config.optimizer.lr) == ("my_mild", "1ep", 0.3)
    shipped = Path(config_dir()) / "recipe" / "mild.yaml"
    mine = tmp_path / "recipe" / "mild.yaml"
    assert capsys.readouterr().err.splitlines() == [
        f"trainrun: note: recipe=mild is read from '{mine}', not trainrun's own '{shipped}'"
    ]
    (config,) = check(["recipe=mild"], files=False)  # without the folder: the packaged recipe
    assert config.name == "mild"
    source, _, overrides = locate([], [f"recipe={tmp_path / 'recipe' / 'mild.yaml'}"])  # by path: the file given
    assert check(overrides, source=source)[0].name == "my_mild"


def _snapshot(directory):
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def previous_run(trained_run, tmp_path):
    """A copy of a finished run: bad input pointed at it must leave every file as it was."""
    copy = tmp_path / "previous"
    shutil.copytree(trained_run, copy)
    return copy


def _empty_folder(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "empty" / split).mkdir(parents=True, exist_ok=True)
    return tmp_path / "empty"


BAD_INPUTS = [
    (["algorithms=[nosuch]"], "unknown option 'nosuch' for 'algorithms'"),
    (["--algorithms", "ema", "nosuch"], "unknown option 'nosuch' for 'algorithms'"),
    (["algorithms=[bce_loss]"], "unknown option 'bce_loss' for 'algorithms': it is now 'loss=bce' (the classifier"),
    (  # a list given with a recipe replaces its methods, but those the recipe's body sets would stay
        ["recipe=mild", "data=digits", "algorithms=[mixup]"],
        "bad value for 'algorithms': [mixup] replaces the recipe's methods, yet blurpool, ema, label_smoothing, "
        "progressive_resizing stay (the recipe sets them) while channels_last goes: name every method the run keeps "
        "(algorithms=[blurpool,channels_last,ema,label_smoothing,progressive_resizing,mixup];",
    ),
    (["optimizer.lrr=0.1"], "unknown config key 'optimizer.lrr'"),
    (["model.hidden_size=64"], "unknown config key 'model.hidden_size': it is now 'model.bert.hidden_size'"),
    (["optimizer.lr=fast"], "bad value for 'optimizer.lr'"),
    (["max_duration=10epochs"], "bad value for 'max_duration'"),
    (["max_duration=0.5dur"], "bad value for 'max_duration'"),
    (["eval_interval=often"], "bad value for 'eval_interval'"),
    (["algorithms=[ema]", "algorithms.ema.half_life=5"], "bad value for 'algorithms.ema.half_life'"),
    (["optimizer.lr=-0.1"], "bad value for 'optimizer.lr'"),
    (["optimizer=sgd", "optimizer.momentum=0"], "bad value for 'optimizer.nesterov': true needs optimizer.momentum"),
    (["scale_schedule_ratio=0"], "bad value for 'scale_schedule_ratio'"),
    (["precision=fp4"], "bad value for 'precision'"),
    (["model=resnet9000"], "unknown option 'resnet9000' for 'model'"),
    (["recipe=scorching"], "unknown option 'scorching' for 'recipe'"),
    (["quality_targets=[1.5]"], "bad value for 'quality_targets'"),
    (["model.num_classes=7"], "bad value for 'model.num_classes'"),
    (["data=folder"], "data=folder needs 'data.path'"),
    (["data=folder", "data.path=/no/such/imagenet"], "'/no/such/imagenet' is not a directory"),
    (["resume=/no/such/checkpoint.pt"], "checkpoint '/no/such/checkpoint.pt' does not exist"),
    (["optimizer.lr=["], "cannot parse override 'optimizer.lr=['"),
    (["-x"], "unknown flag '-x'"),
    (["train_batch_size=5000"], "train_batch_size 5000 is larger than the 1438 training samples"),
    (["data=folder", "data.num_classes=2", "data.path={empty}"], "no images in data folder"),
    (["--algorithms", "mixup", "cutmix"], "algorithms 'cutmix' and 'mixup' cannot run together"),
    (["algorithms=[randaugment]", "data=digits_ffcv"], "algorithm 'randaugment' transforms images in the torch"),
    (["algorithms=[fixres]"], "bad value for 'algorithms.fixres.train_resolution': 176 (must be below"),
    (["eval_interval=0ep"], "bad value for 'eval_interval': '0ep' is an interval of zero, which never fires"),
    (["checkpoint.interval=0ba"], "bad value for 'checkpoint.interval': '0ba' is an interval of zero"),
    (["algorithms=[ema]", "algorithms.ema.update_interval=0ba"], "'algorithms.ema.update_interval': '0ba' is an"),
    (["algorithms=[ema,sam,ema]"], "bad value for 'algorithms': 'ema' is listed twice"),
    (["--algorithms", "sam", "sam"], "bad value for 'algorithms': 'sam' is listed twice"),
    (["launcher.devices=3"], "bad value for 'train_batch_size': 64 does not divide among 3 processes"),
    (["launcher.devices=2", "eval_batch_size=511"], "bad value for 'eval_batch_size': 511 does not divide among 2"),
    (["stop_at=1.5"], "bad value for 'stop_at': 1.5"),
    (["--config-dir", "/no/such/conf"], "bad value for '--config-dir': directory '/no/such/conf' not found"),
    (["-cp", "/no/such/conf"], "bad value for '--config-path': directory '/no/such/conf' not found"),
    (["-cn", "nosuch"], "bad value for '--config-name': no config 'nosuch.yaml' in"),
    (["recipe=/no/such/recipe.yaml"], "bad value for 'recipe': file '/no/such/recipe.yaml' not found"),
    (["max_duration=-5min"], "bad value for 'max_duration': '-5min' is not a time"),
    (["max_duration=0s"], "bad value for 'max_duration': '0s' (a budget must be above zero)"),
    (["max_duration=0ba"], "bad value for 'max_duration': '0ba' (a run must be longer than zero)"),
    (["seed=-1"], "bad value for 'seed': -1 (must be >= 0)"),
    (["algorithms.ema.half_life=10ba"], "unknown config key 'algorithms.ema': 'ema' is not among this run's algo"),
    (["max_duration=2usd"], "max_duration=2usd needs a price: choose a priced hardware option"),
    (["max_duration=1s", "profile_prefix=5ba"], "'profile_prefix' extrapolates a run of fixed length"),
    (["eval_interval=5min"], "bad value for 'eval_interval': '5min' is a budget; only max_duration takes one"),
    (["scheduler=multistep", "scheduler.milestones=[2ba,soon]"], "bad value for 'scheduler.milestones': "),
    (["model.weights=/no/such/weights"], "bad value for 'model.weights': '/no/such/weights' does not exist"),
]


# found when the data are read, after a run folder holding an earlier run is refused: these go to a new folder
READ_WITH_THE_DATA = ("train_batch_size 5000 is larger than", "no images in data folder")


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line_and_changes_nothing(args, message, previous_run, tmp_path):
    before = _snapshot(previous_run)
    args = [a.replace("{empty}", str(_empty_folder(tmp_path))) for a in args]
    run_dir = tmp_path / "new" if message.startswith(READ_WITH_THE_DATA) else previous_run
    result = run_here(*TINY, *args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainrun: error:"), result.stderr
    assert message in lines[0]
    assert _snapshot(previous_run) == before
    assert not (tmp_path / "new" / "metrics.jsonl").exists() and not (tmp_path / "new" / "checkpoints").exists()


@pytest.mark.slow
def test_corrupt_checkpoint_on_resume(previous_run, tmp_path):
    newest = sorted((previous_run / "checkpoints").glob("*.pt"), key=lambda p: p.stat().st_mtime)[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    before = _snapshot(previous_run)
    for resume in ("auto", str(newest)):
        result = run_here(*TINY, f"hydra.run.dir={previous_run}", f"resume={resume}", cwd=tmp_path)
        assert result.returncode == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "is corrupt or not a trainrun checkpoint" in lines[0], result.stderr
        assert _snapshot(previous_run) == before


@pytest.mark.slow
def test_nan_loss_stops_naming_the_step(tmp_path):
    run_dir = tmp_path / "nan"
    result = run_here(*TINY, "optimizer.lr=1e12", "log_interval=1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "at step" in lines[0] and "loss is" in lines[0], result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "at step" in summary["error"]


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("optimizer.lrr=1", "--debug", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_metrics_of_a_shared_run(trained_run):
    records = read_metrics(trained_run)
    assert [r["epoch"] for r in records] == [1.0, 2.0]
    for key in (
        "epoch",
        "batch",
        "samples",
        "train_seconds",
        "wall_seconds",
        "throughput",
        "lr",
        "train_loss",
        "top1",
        "top5",
    ):
        assert key in records[0]
    assert records[0]["train_seconds"] <= records[0]["wall_seconds"]


def test_a_key_that_moved_under_its_kind_is_refused_naming_where_it_went():
    from omegaconf import OmegaConf

    from trainrun.errors import ConfigError
    from trainrun.validation import moved_keys, validate

    moved = moved_keys()
    assert (
        moved["data.max_seq_len"] == "data.text.max_seq_len"
        and moved["data.batches_ahead"] == "data.ffcv.batches_ahead"
    )
    assert moved["model.width"] == "model.resnet_small.width" and moved["model.layers"] == "model.bert.layers"
    assert moved["model.qk_norm"] == "model.gpt.qk_norm" and moved["model.dropout"] == "model.gpt.dropout"
    assert moved["data.patch_size"] == "data.segmentation.patch_size" and moved["model.strides"] == "model.unet.strides"
    assert moved["data.tokenizer"] == "data.text.tokenizer" and moved["model.window"] == "model.gpt.window"
    assert moved["model.value_embeddings"] == "model.gpt.value_embeddings"
    assert moved["data.val_tokens"] == "data.text.val_tokens" and len(moved) == 62  # the first kind naming it
    for old, new in moved.items():  # as a user's own YAML (a --config-dir recipe) would spell it
        group, key = old.split(".")
        with pytest.raises(ConfigError, match=f"^unknown config key '{old}': it is now '{new}' "):
            validate(OmegaConf.create({group: {key: 1}}), files=False)


def test_a_new_run_in_a_folder_holding_an_earlier_run_is_refused_and_changes_nothing(previous_run, tmp_path):
    before = _snapshot(previous_run)
    result = run_here(*TINY, f"hydra.run.dir={previous_run}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"trainrun: error: bad value for 'hydra.run.dir': '{previous_run}' holds an earlier run (metrics.jsonl); "
        "continue it with resume=auto, or choose another folder"
    ]
    assert _snapshot(previous_run) == before
    only_checkpoints = tmp_path / "crashed"  # a run that died after its first checkpoint, before an evaluation
    (only_checkpoints / "checkpoints").mkdir(parents=True)
    (only_checkpoints / "checkpoints" / "ep0-ba6.pt").write_bytes(b"")
    (only_checkpoints / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"holds an earlier run \(checkpoints/ep0-ba6.pt\); continue it with"):
        check([*TINY, f"hydra.run.dir={only_checkpoints}"])
    check([*TINY, f"hydra.run.dir={only_checkpoints}", "resume=auto"])  # continuing it is what resume is for
    (only_checkpoints / "checkpoints" / "ep0-ba6.pt").unlink()
    check([*TINY, f"hydra.run.dir={only_checkpoints}"])  # a config.yaml alone is no run's record


def test_resume_auto_without_a_checkpoint_starts_the_records_over(tmp_path):
    from types import SimpleNamespace

    from trainrun.run import resume

    calls = []
    logs = SimpleNamespace(resume_from=calls.append)
    trainer = SimpleNamespace(settings=SimpleNamespace(checkpoint_dir=tmp_path / "checkpoints"))
    assert resume(SimpleNamespace(resume="auto"), trainer, logs, None) is None
    assert calls == [0]  # records after step 0 (an earlier attempt's) are dropped
    assert resume(SimpleNamespace(resume=None), trainer, logs, None) is None and calls == [0]


def test_the_former_accuracy_targets_key_is_read_as_quality_targets_with_one_notice(capsys):
    (config,) = check(["accuracy_targets=[0.5,0.6]"], files=False)
    assert config.quality_targets == [0.5, 0.6] and config.accuracy_targets is None
    assert capsys.readouterr().err == (
        "trainrun: note: 'accuracy_targets' is now 'quality_targets'; "
        "read as quality_targets (rename it in your config)\n"
    )
    (config,) = check(["quality_targets=[0.7]"], files=False)
    assert config.quality_targets == [0.7] and capsys.readouterr().err == ""


def test_a_private_config_folder_of_a_killed_process_is_removed_by_the_next_one(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from trainrun.config import private_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"trainrun-config-{gone.stdout.strip()}-abc"  # its process ended without cleaning up
    stale.mkdir()
    alive = tmp_path / f"trainrun-config-{os.getppid()}-def"  # a running process's: kept
    alive.mkdir()
    other = tmp_path / "trainrun-config-xyz"  # not named by a process: left alone
    other.mkdir()
    mine = private_folder("trainrun-config-")
    assert mine.parent == tmp_path and mine.name.startswith(f"trainrun-config-{os.getpid()}-")
    assert not stale.exists() and alive.is_dir() and other.is_dir()


def test_help_lists_every_command_with_its_purpose():
    import yaml

    from trainrun.commands import SUBCOMMANDS

    header = yaml.safe_load((config_dir() / "config.yaml").read_text())["hydra"]["help"]["header"]
    listed = header.split("Commands:\n")[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == list(SUBCOMMANDS)


def test_help_is_trainruns_own_template_without_internal_groups_and_with_the_overrides_applied(tmp_path):
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "mine.yaml").write_text("# @package _global_\nname: mine\n")
    result = run_cli("--help", "--config-dir", str(tmp_path), "optimizer=adamw", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "schema" not in result.stdout and "$APP_CONFIG_GROUPS" not in result.stdout
    assert "\nrecipe: baseline, bert_base," in result.stdout and ", mine," in result.stdout  # the user's recipe too
    config = result.stdout.split("== Config ==")[1]
    assert "  name: adamw\n" in config and "Commands:" in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task=causal_lm", "data=stdlib_docs"],
            "bad value for 'data': 'stdlib_docs' (data.name 'text'; with task=causal_lm it must be token_stream or "
            "token_mix or token_shards); choose data=stdlib_stream or data=token_stream or data=token_mix or "
            "data=token_shards",
        ),
        (
            ["data=stdlib_docs"],
            "bad value for 'task.name': 'image_classification' (with data=stdlib_docs it must be masked_lm); "
            "choose task=masked_lm",
        ),
        (
            ["task=segmentation", "data=digits", "model=unet2d"],
            "bad value for 'data.name': 'digits' (with task=segmentation it must be synthetic_brats or decathlon); "
            "choose data=synthetic_brats or data=decathlon",
        ),
    ],
)
def test_kinds_that_do_not_fit_are_named_as_the_user_chose_them(overrides, message):
    with pytest.raises(ConfigError) as error:
        check([*overrides, "max_duration=1ba"], files=False)
    assert str(error.value) == message


def test_a_run_is_composed_and_validated_once_and_a_multirun_each_job_once(monkeypatch, tmp_path):
    """One composition and one validation start a run (its ranks get the validated config); a
    multirun's jobs are validated once each, before the first starts, and train their own."""
    from trainrun import commands, config
    from trainrun.commands import train

    calls = {"compose": 0, "validate": 0}

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(config, "compose", counted("compose", config.compose))
    monkeypatch.setattr(config, "validate", counted("validate", config.validate))
    run_hydra = train._run_hydra
    monkeypatch.setattr(train, "_run_hydra", lambda *args: pytest.fail("a single run went through Hydra's entry"))
    assert commands.main([*TINY, f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    assert calls == {"compose": 1, "validate": 1}
    assert "seed: 42" in (tmp_path / "run" / "config.yaml").read_text()

    monkeypatch.setattr(train, "_run_hydra", run_hydra)
    calls.update(compose=0, validate=0)
    assert commands.main(["-m", *TINY, "seed=3,4", f"hydra.sweep.dir={tmp_path / 'sweep'}"]) == 0
    assert calls["validate"] == 2
    for job, seed in (("0", 3), ("1", 4)):
        assert f"seed: {seed}\n" in (tmp_path / "sweep" / job / "config.yaml").read_text()


UNDER_A_FILE = {  # command line (A_FILE: a regular file's path), the key its refusal names
    "write-text": (["write-text", "stdlib_docs", "{A_FILE}/store"], "OUT"),
    "write-text onto a file": (["write-text", "stdlib_docs", "{A_FILE}", "--overwrite"], "OUT"),
    "write": (["write", "digits", "{A_FILE}/digits.beton"], "OUT"),
    "write onto a folder": (["write", "digits", "{FOLDER}", "--overwrite"], "OUT"),
    "consolidate --output": (["consolidate", "{CHECKPOINT}", "--output", "{A_FILE}/x.pt"], "--output"),
    "consolidate --hf": (["consolidate", "{CHECKPOINT}", "--hf", "{A_FILE}/hf"], "--hf"),
    "consolidate --hf onto a file": (["consolidate", "{CHECKPOINT}", "--hf", "{A_FILE}"], "--hf"),
    "predict --out onto a file": (["predict", "{FOLDER}", "--data", "{FOLDER}", "--out", "{A_FILE}"], "--out"),
    "ensemble --out": (["ensemble", "{FOLDER}", "--data", "{FOLDER}", "--out", "{A_FILE}/e.json"], "--out"),
    "report --out": (["report", "{FOLDER}", "--out", "{A_FILE}/report"], "--out"),
    "sweep out=": (["sweep", *TINY, "budgets=[1,2]", "out={A_FILE}/sweep"], "out"),
    "a run's folder": ([*TINY, "hydra.run.dir={A_FILE}/run"], "hydra.run.dir"),
}


@pytest.mark.parametrize("case", UNDER_A_FILE)
def test_an_output_under_a_regular_file_is_refused_before_any_work_and_nothing_is_written(tmp_path, case):
    """Every command's output path: under (or onto) a file where a folder must be, or a folder where a
    file must be, is one line naming the key, exit 2, before any work, and nothing is written."""
    a_file, folder, checkpoint = tmp_path / "a_file", tmp_path / "folder", tmp_path / "run" / "checkpoints" / "ep0-ba1"
    a_file.write_text("kept\n")
    folder.mkdir()
    checkpoint.mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    command, key = UNDER_A_FILE[case]
    paths = {"{A_FILE}": a_file, "{FOLDER}": folder, "{CHECKPOINT}": checkpoint}
    for placeholder, path in paths.items():
        command = [part.replace(placeholder, str(path)) for part in command]
    result = run_here(*command)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"trainrun: error: bad value for '{key}': "), result.stderr
    assert sorted(tmp_path.rglob("*")) == before and a_file.read_text() == "kept\n"


BAD_OPTIONS = {  # a subcommand's option past its bounds (OUT: a path in the test's folder), the key named
    "estimate --peak-tflops -5": (["estimate", "--peak-tflops", "-5"], "--peak-tflops"),
    "estimate --peak-tflops 0": (["estimate", "--peak-tflops", "0"], "--peak-tflops"),
    "estimate --peak-tflops inf": (["estimate", "--peak-tflops", "inf"], "--peak-tflops"),
    "estimate --peak-tflops nan": (["estimate", "--peak-tflops", "nan"], "--peak-tflops"),
    "estimate --mfu 0": (["estimate", "--mfu", "0"], "--mfu"),
    "estimate --mfu 1.5": (["estimate", "--mfu", "1.5"], "--mfu"),
    "estimate --mfu nan": (["estimate", "--mfu", "nan"], "--mfu"),
    "estimate --steps 0": (["estimate", "--steps", "0"], "--steps"),
    "estimate --vocab -1": (["estimate", "--vocab", "-1"], "--vocab"),
    "write-text --split-seed -1": (["write-text", "stdlib_docs", "{OUT}", "--split-seed", "-1"], "--split-seed"),
    "write-text --workers -1": (["write-text", "stdlib_docs", "{OUT}", "--workers", "-1"], "--workers"),
    "write-text --shard-tokens 0": (["write-text", "stdlib_docs", "{OUT}", "--shard-tokens", "0"], "--shard-tokens"),
    "write-text --tokenizer-sample 0": (
        ["write-text", "stdlib_docs", "{OUT}", "--tokenizer-sample", "0"],
        "--tokenizer-sample",
    ),
    "write-text --val-fraction 1": (["write-text", "stdlib_docs", "{OUT}", "--val-fraction", "1"], "--val-fraction"),
    "write-text --vocab-size 100": (
        ["write-text", "stdlib_docs", "{OUT}", "--tokenizer-kind", "bpe", "--vocab-size", "100"],
        "--vocab-size",
    ),
    "write-text --vocab-size 2**32 + 1": (
        ["write-text", "stdlib_docs", "{OUT}", "--vocab-size", str(2**32 + 1)],
        "--vocab-size",
    ),
    "write-text --dtype uint16": (
        ["write-text", "stdlib_docs", "{OUT}", "--vocab-size", "70000", "--dtype", "uint16"],
        "--dtype",
    ),
    "write-text --tokenizer missing": (
        ["write-text", "stdlib_docs", "{OUT}", "--tokenizer", "{OUT}.json"],
        "--tokenizer",
    ),
    "write-text --split on a built-in": (["write-text", "stdlib_docs", "{OUT}", "--split", "test"], "--split"),
    "consolidate --hf of an image run": (["consolidate", "{IMAGE_CHECKPOINT}", "--hf", "{OUT}"], "CHECKPOINT"),
    "predict of an image run": (["predict", "{IMAGE_RUN}", "--data", "{OUT}", "--out", "{OUT}"], "RUNS"),
    "ensemble of an image run": (["ensemble", "{IMAGE_RUN}", "--data", "{OUT}", "--out", "{OUT}.json"], "RUNS"),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_a_subcommands_option_past_its_bounds_is_one_line_before_any_work(tmp_path, case, trained_run):
    """``estimate``, ``write-text``, ``consolidate``, ``predict`` and ``ensemble``: a value past an
    option's bounds, or a run of a task the command does not read, is one line naming the option,
    exit 2, before any work, and nothing is written."""
    image_run = tmp_path / "image_run"
    (image_run / "checkpoints" / "ep0-ba1").mkdir(parents=True)
    for name in ("config.yaml", "summary.json"):
        (image_run / name).write_bytes((trained_run / name).read_bytes())
    before = sorted(tmp_path.rglob("*"))
    command, key = BAD_OPTIONS[case]
    paths = {
        "{OUT}": tmp_path / "out",
        "{IMAGE_RUN}": image_run,
        "{IMAGE_CHECKPOINT}": image_run / "checkpoints" / "ep0-ba1",
    }
    for placeholder, path in paths.items():
        command = [part.replace(placeholder, str(path)) for part in command]
    result = run_here(*command)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"trainrun: error: bad value for '{key}': "), result.stderr
    assert sorted(tmp_path.rglob("*")) == before


def bounded_fields(instance: object, prefix: str = "") -> list[tuple[object, str, str, dict]]:
    """(section, field name, dotted key, metadata) of every numeric field with a bound, recursively."""
    import dataclasses

    found = []
    for spec in dataclasses.fields(instance):
        value = getattr(instance, spec.name)
        if dataclasses.is_dataclass(value):
            found += bounded_fields(value, f"{prefix}{spec.name}.")
        elif {"min", "max", "exclusive_min", "exclusive_max"} & spec.metadata.keys():
            found.append((instance, spec.name, f"{prefix}{spec.name}", dict(spec.metadata)))
    return found


def test_every_bounded_setting_refuses_a_value_past_each_bound_naming_the_key():
    """Momentum, betas, fractions, counts: over every bounded field of the schema and of every
    method's settings, a value just past each bound is one line naming the key. From the command
    line: optimizer=sgd optimizer.momentum=1.5, and the momentum that never decays, 1.0."""
    import copy

    from trainrun.algorithms.specs import SPECS
    from trainrun.schema import TrainConfig
    from trainrun.validation import check_fields

    sections = [(TrainConfig(), "")] + [(spec.config(), f"algorithms.{name}.") for name, spec in SPECS.items()]
    fields = [entry for section, prefix in sections for entry in bounded_fields(section, prefix)]
    past = {"min": -1e-3, "exclusive_min": 0.0, "max": 1e-3, "exclusive_max": 0.0}
    tried = 0
    for section, name, key, meta in fields:
        for bound, step in past.items():
            if bound not in meta:
                continue
            value = meta[bound] + step
            bad = copy.deepcopy(section)
            numbers = getattr(bad, name)
            setattr(bad, name, [*(numbers[:1] or [1]), value] if isinstance(numbers, list) else value)
            with pytest.raises(ConfigError, match=rf"^bad value for '{key}': "):
                check_fields(bad, key.removesuffix(name))
            tried += 1
    assert tried > 60
    for momentum in ("1.5", "1.0", "-0.1"):
        result = run_here("optimizer=sgd", f"optimizer.momentum={momentum}", "max_duration=1ba")
        assert result.returncode == 2 and result.stderr.startswith(
            "trainrun: error: bad value for 'optimizer.momentum'"
        )
