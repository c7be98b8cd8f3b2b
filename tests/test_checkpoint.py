"""Checkpoint files without a run: names and order, atomic writes, loading, random streams, resume, pruning."""

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainrun.core.checkpoint import (
    atomic_torch_save,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    prune,
    rank_rng_state,
    resolve_resume,
    restore_rng_state,
    rng_state,
)
from trainrun.errors import CheckpointError

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
    with pytest.raises(CheckpointError, match="is corrupt or not a trainrun checkpoint: .*Weights only load failed"):
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


def test_random_streams_continue_where_they_were_saved():
    """Python, NumPy and torch draws after a restore are those that followed the save."""
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    saved = rng_state()
    expected = (torch.rand(3), random.random(), np.random.rand(2))
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    restore_rng_state(saved)
    got = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1] and np.array_equal(got[2], expected[2])
    assert saved["cuda"] is None  # no CUDA here: nothing recorded, nothing restored


def test_random_streams_continue_after_a_round_trip_through_a_checkpoint_file(tmp_path):
    """Python's state (tuples of ints) survives torch.save and a weights_only load as it was."""
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    atomic_torch_save({"format": "trainrun/1", "rng": rng_state()}, tmp_path / "ep0-ba1.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    restore_rng_state(load_checkpoint(tmp_path / "ep0-ba1.pt")["rng"])
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])


def test_each_rank_gets_its_own_random_state_and_another_world_size_is_refused():
    states = [{"rank": 0}, {"rank": 1}]
    assert rank_rng_state(states, 1, 2) == {"rank": 1} and rank_rng_state(states, 0, 2) == {"rank": 0}
    assert rank_rng_state({"rank": 0}, 0, 1) == {"rank": 0}  # a one-rank run's single dict
    with pytest.raises(CheckpointError, match=r"random state of 2 rank\(s\) and this run has 3: resume with 2 process"):
        rank_rng_state(states, 0, 3)


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
    assert calls == [{"map_location": "cpu", "weights_only": True}]


class FakeCuda:
    """torch.cuda's random-state calls for a process whose current GPU is ``current`` of ``visible``."""

    def __init__(self, available: bool, visible: int = 8, current: int = 3) -> None:
        self.available, self.visible, self.current, self.restored = available, visible, current, []

    def install(self, monkeypatch) -> None:
        def set_rng_state(state, device="cuda"):
            if self.current >= self.visible:
                raise IndexError("list index out of range")  # what a state for a missing GPU meets
            self.restored.append((self.current, state))

        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.available)
        monkeypatch.setattr(
            torch.cuda, "get_rng_state", lambda device="cuda": torch.full((4,), self.current, dtype=torch.uint8)
        )
        monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every GPU's state was read"))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("every GPU's state was set"))


def test_the_own_gpus_random_state_is_saved_and_restored_where_other_gpus_are_visible(monkeypatch):
    """Rank 3 of 8 GPUs saves its own GPU's state; the resume sees one GPU (index 0) and continues it."""
    gpu = FakeCuda(available=True, visible=8, current=3)
    gpu.install(monkeypatch)
    saved = rng_state()
    assert saved["cuda"].tolist() == [3, 3, 3, 3]
    one_gpu = FakeCuda(available=True, visible=1, current=0)
    one_gpu.install(monkeypatch)
    restore_rng_state(saved)
    assert [(device, state.tolist()) for device, state in one_gpu.restored] == [(0, [3, 3, 3, 3])]
    cpu_only = FakeCuda(available=False)  # a GPU run resumed on a machine without one
    cpu_only.install(monkeypatch)
    restore_rng_state(saved)
    assert cpu_only.restored == []
    assert rng_state()["cuda"] is None
    gpu.install(monkeypatch)
    for from_cpu in (None, []):  # a CPU run resumed on a GPU machine (also one saved before this form)
        restore_rng_state({**saved, "cuda": from_cpu})
    assert gpu.restored == []


def test_pruning_a_checkpoint_another_process_already_deleted_is_no_error(tmp_path, monkeypatch):
    import trainrun.core.checkpoint as checkpoint

    (tmp_path / "ep0-ba9.pt").write_bytes(b"")
    gone = [tmp_path / "ep0-ba1.pt", tmp_path / "ep0-ba9.pt"]
    monkeypatch.setattr(checkpoint, "list_checkpoints", lambda directory: gone)
    prune(tmp_path, keep=1)  # ep0-ba1.pt was listed, then removed by another rank
    assert (tmp_path / "ep0-ba9.pt").is_file()
