"""Checkpoint files without a run: names and order, atomic writes, loading, topology, resume, pruning."""

import io
import os
import re
from pathlib import Path

import pytest
import torch

from trainrun.core.checkpoint import (
    FORMAT,
    atomic_torch_save,
    check_model_shapes,
    check_topology,
    checkpoint_name,
    directory,
    list_checkpoints,
    load_checkpoint,
    prune,
    resolve_resume,
)
from trainrun.errors import CheckpointError, ConfigError

PAYLOAD = {"format": "trainrun/1", "model": {"w": torch.arange(3.0)}, "progress": {"batch": 7}}


def test_names_sort_by_batch_not_by_text_and_other_files_are_ignored(tmp_path):
    assert checkpoint_name(3, 120) == "ep3-ba120.pt"
    for epoch, batch in ((0, 9), (1, 10), (10, 100), (2, 20), (0, 3)):
        (tmp_path / checkpoint_name(epoch, batch)).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "ep1-ba10.pt.partial").write_bytes(b"")
    names = ["ep0-ba3.pt", "ep0-ba9.pt", "ep1-ba10.pt", "ep2-ba20.pt", "ep10-ba100.pt"]
    assert [p.name for p in list_checkpoints(tmp_path)] == names
    assert list_checkpoints(tmp_path / "absent") == []
    prune(tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep2-ba20.pt", "ep10-ba100.pt"]
    assert (tmp_path / "notes.txt").is_file()


def test_a_saved_payload_loads_back_and_damaged_or_foreign_files_are_refused(tmp_path):
    path = tmp_path / "ep0-ba7.pt"
    atomic_torch_save(PAYLOAD, path)
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], PAYLOAD["model"]["w"]) and loaded["progress"] == {"batch": 7}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep0-ba7.pt"]  # no temporary file left
    with pytest.raises(CheckpointError, match=r"^checkpoint '.*absent\.pt' does not exist$"):
        load_checkpoint(tmp_path / "absent.pt")
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(path.read_bytes()[:100])
    with pytest.raises(
        CheckpointError, match=r"^checkpoint '.*damaged\.pt' is corrupt or not a trainrun checkpoint: "
    ) as bad:
        load_checkpoint(damaged)
    try:
        torch.load(damaged, weights_only=True)
    except Exception as error:  # the reason shown is the first line of torch's own
        assert str(bad.value).endswith(": " + str(error).splitlines()[0])
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": "trainrun/1", "model": Path("not a tensor")}, pickled)  # needs unpickling code
    with pytest.raises(
        CheckpointError,
        match=r"is corrupt or not a trainrun checkpoint: Unsupported global: GLOBAL pathlib.PosixPath was not "
        r"an allowed global by default$",
    ):
        load_checkpoint(pickled)
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "other"}, foreign)
    with pytest.raises(CheckpointError, match=r"^checkpoint '.*foreign\.pt' is not a trainrun checkpoint$"):
        load_checkpoint(foreign)
    torch.save([1, 2], foreign)
    with pytest.raises(CheckpointError, match="is not a trainrun checkpoint$"):
        load_checkpoint(foreign)


def test_a_write_the_disk_refuses_raises_its_os_error_not_torchs_runtime_error(monkeypatch):
    """torch's zip writer turns a failed write into a RuntimeError about a file position; the
    caller gets the file system's own error (disk full), which names the cause."""

    class FullDisk(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 1000:
                raise OSError(28, "No space left on device")
            return super().write(data)

    monkeypatch.setattr("trainrun.core.checkpoint.atomic_write", lambda path, save: save(FullDisk()))
    with pytest.raises(OSError, match="No space left on device") as caught:
        atomic_torch_save({**PAYLOAD, "model": {"w": torch.zeros(10_000)}}, Path("unused.pt"))
    assert caught.type is OSError and caught.value.errno == 28


def test_a_checkpoint_resumes_on_any_number_of_ranks_that_divides_its_global_batch():
    """Nothing in a checkpoint is per rank: 2 ranks' checkpoint of a 96-sample batch continues on
    1, 3, 4 or 96 ranks; 5 ranks and another global batch are refused in one line."""
    payload = {"topology": {"world_size": 2, "global_batch": 96}}
    for ranks in (1, 2, 3, 4, 96):
        check_topology(payload, 96, ranks)
    with pytest.raises(
        CheckpointError,
        match=r"^checkpoint 'c\.pt' has a global batch of 96, which does not divide among 5 processes; resume on a "
        r"number of processes that divides 96 \(it was written by 2\)$",
    ):
        check_topology(payload, 96, 5, Path("c.pt"))
    with pytest.raises(CheckpointError, match=r"global batch of 96 \(train_batch_size\); this run has 64: resume with"):
        check_topology(payload, 64, 2)
    check_topology({"format": "trainrun/1"}, 64, 5)  # written before checkpoints recorded it: not checked
    with pytest.raises(CheckpointError, match=r"^the checkpoint has a global batch of 96, which does not divide"):
        check_topology(payload, 96, 7)
    assert directory(Path("runs/a")) == Path("runs/a/checkpoints")


def test_resume_auto_takes_the_newest_checkpoint_and_a_path_must_exist(tmp_path):
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None  # nothing yet: a fresh start
    for batch in (5, 40, 12):
        (tmp_path / checkpoint_name(0, batch)).write_bytes(b"")
    assert resolve_resume("auto", tmp_path) == tmp_path / "ep0-ba40.pt"
    assert resolve_resume(str(tmp_path / "ep0-ba5.pt"), tmp_path / "elsewhere") == tmp_path / "ep0-ba5.pt"
    with pytest.raises(CheckpointError, match=r"^checkpoint '.*nope\.pt' does not exist \(resume=.*nope\.pt\)$"):
        resolve_resume(str(tmp_path / "nope.pt"), tmp_path)


def test_an_empty_file_is_refused_by_the_name_of_torchs_error(tmp_path):
    """An error without a message (an empty file: EOFError) is named by its type."""
    empty = tmp_path / "ep0-ba1.pt"
    empty.write_bytes(b"")
    with pytest.raises(
        CheckpointError, match=r"^checkpoint '.*ep0-ba1\.pt' is corrupt or not a trainrun checkpoint: EOFError$"
    ):
        load_checkpoint(empty)


def test_checkpoints_load_onto_the_cpu_whatever_device_wrote_them(tmp_path, monkeypatch):
    """A checkpoint written on a GPU is read with ``map_location='cpu'`` (the trainer moves it)."""
    atomic_torch_save(PAYLOAD, tmp_path / "ep0-ba7.pt")
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: calls.append(kwargs) or real_load(*args, **kwargs))
    load_checkpoint(tmp_path / "ep0-ba7.pt")
    assert calls == [{"map_location": "cpu", "weights_only": True, "mmap": False}]


def test_pruning_a_checkpoint_another_process_already_deleted_is_no_error(tmp_path, monkeypatch):
    import trainrun.core.checkpoint as checkpoint

    (tmp_path / "ep0-ba9.pt").write_bytes(b"")
    gone = [tmp_path / "ep0-ba1.pt", tmp_path / "ep0-ba9.pt"]
    monkeypatch.setattr(checkpoint, "list_checkpoints", lambda directory: gone)
    prune(tmp_path, keep=1)  # ep0-ba1.pt was listed, then removed by another rank
    assert (tmp_path / "ep0-ba9.pt").is_file()


def test_a_checkpoint_of_another_model_shape_is_one_line_naming_the_first_weight_that_differs():
    run = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).state_dict()
    wider = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Linear(16, 2)).state_dict()
    check_model_shapes(run, run)  # the same model: nothing to say
    with pytest.raises(CheckpointError) as error:
        check_model_shapes(run, wider)
    assert str(error.value) == (
        "the checkpoint holds another model than this run's: '0.weight' is [16, 4] there and [8, 4] in this "
        "run's model (2 more differ); resume with the model settings it was trained with (its run's config.yaml)"
    )
    deeper = {**run, "2.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"it has '2.weight', which this run's model has not;"):
        check_model_shapes(run, deeper)
    with pytest.raises(CheckpointError, match=r"it lacks '1.weight' \(1 more differ\)"):
        check_model_shapes(run, {"0.weight": run["0.weight"], "0.bias": run["0.bias"]})


def sharded_checkpoint(folder: Path) -> Path:
    """A sharded checkpoint (DCP's files, trainer.pt) of a tiny Llama and its AdamW state, written here."""
    from trainrun.core.sharded_checkpoint import ShardedCheckpoints
    from trainrun.models.llama import Llama
    from trainrun.schema import LlamaConfig

    model = Llama(LlamaConfig(layers=1, width=32, heads=2, kv_heads=1, ffn_hidden=64, max_seq_len=8), 40)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 40, (1, 8))).sum().backward()
    optimizer.step()
    path = folder / "checkpoints" / "ep0-ba1"
    ShardedCheckpoints(True, 1, keep=2, asynchronous=False).save(path, model, optimizer, {"format": FORMAT})
    return path


def one_byte_short(shard: Path) -> None:
    """Cut the last byte off ``shard`` (DCP writes its entries back to back: the last ends where the file does)."""
    os.truncate(shard, shard.stat().st_size - 1)


DAMAGES = {
    "metadata garbled": (lambda path: (path / ".metadata").write_bytes(b"garbage"), "/.metadata' is damaged"),
    "metadata empty": (lambda path: (path / ".metadata").write_bytes(b""), "/.metadata' is damaged"),
    "shard missing": (lambda path: (path / "__0_0.distcp").unlink(), "__0_0.distcp' is missing"),
    "shard truncated": (lambda path: os.truncate(path / "__0_0.distcp", 100), "__0_0.distcp' has 100 bytes"),
    "shard one byte short": (
        lambda path: one_byte_short(path / "__0_0.distcp"),
        "__0_0.distcp' has {short:,} bytes, its .metadata needs {size:,}",  # by value: found and needed
    ),
    "trainer.pt truncated": (lambda path: os.truncate(path / "trainer.pt", 50), "trainer.pt' is corrupt"),
    "trainer.pt missing": (lambda path: (path / "trainer.pt").unlink(), "is not a sharded trainrun checkpoint"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_sharded_checkpoint_is_one_line_naming_the_file_for_resume_weights_and_consolidate(
    tmp_path, damage, capsys
):
    """The class of damaged sharded checkpoints: each read (resume's, model.weights', consolidate's)
    refuses it in one line naming the file, exit 2, and consolidate writes nothing."""
    from trainrun.commands import main
    from trainrun.models.weights import sharded_files_whole

    path = sharded_checkpoint(tmp_path)
    harm, named = DAMAGES[damage]
    size = (path / "__0_0.distcp").stat().st_size
    named = named.format(size=size, short=size - 1)  # the sizes, where the refusal names them
    harm(path)
    with pytest.raises(CheckpointError, match=re.escape(named)):
        load_checkpoint(path)  # what resume= and consolidate read first
    if damage.startswith(("metadata", "shard")):  # model.weights reads the shards alone
        with pytest.raises(ConfigError, match="^bad value for 'model.weights': checkpoint .*" + re.escape(named)):
            sharded_files_whole(path)
    assert main(["consolidate", str(path), "--output", str(tmp_path / "one.pt")]) == 2
    error = capsys.readouterr().err.strip()
    assert named in error and len(error.splitlines()) == 1 and not (tmp_path / "one.pt").exists()
