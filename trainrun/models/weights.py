"""Starting weights for a run (``model.weights``) and BERT exported for ``transformers``.

A run may start from trained weights instead of its initialisers, as MLPerf BERT-Large's phase 2
starts from the phase-1 checkpoint: a folder written by Hugging Face's ``save_pretrained`` (read
by ``transformers`` itself, so every format and old parameter name it knows is read), a state
dict saved with ``torch.save``, or a trainrun checkpoint. Weights are loaded into the model as
built, before any algorithm changes it, and must cover it: a weight left out or of another shape
is a configuration error naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from trainrun.atomic_io import atomic_directory
from trainrun.core.checkpoint import FORMAT as CHECKPOINT_FORMAT
from trainrun.core.checkpoint import check_shard_files, load_failure
from trainrun.errors import CheckpointError, ConfigError
from trainrun.models.glu import GatedIntermediate

KEY = "model.weights"
Weights = Mapping[str, torch.Tensor]  # a state dict, or a published folder's tensors read when asked for


def load_weights(model: nn.Module, path: str) -> None:
    """Load the weights at ``path`` into ``model`` (a Hugging Face folder into trainrun's BERT, a
    file or a sharded checkpoint's folder into any)."""
    source = Path(path).expanduser()
    if (source / ".metadata").is_file():  # a sharded checkpoint (parallel=fsdp), read whole
        from trainrun.core.sharded_checkpoint import whole_weights

        sharded_files_whole(source)
        state = whole_weights(source)
    elif source.is_dir() and hasattr(model, "published_state"):  # a GPT's or a Llama's adapter
        state = model.published_state(source)
    elif source.is_dir():
        bert = getattr(model, "bert", None)
        if bert is None:
            readers = "only a BERT, GPT or Llama reads one"
            raise ConfigError(f"bad value for '{KEY}': '{path}' is a Hugging Face folder; {readers}")
        state = _hugging_face_state(bert, source)
        model = bert
    else:
        state = _weights_file(source, path)
    on_meta = any(parameter.is_meta for parameter in model.parameters())
    if on_meta and hasattr(model, "starting_weights"):  # set where each rank materialises its shards
        model.starting_weights = fitting(model, state, path)
        return
    if not isinstance(state, dict):  # a published folder's tensors, read one at a time into the model
        fitting(model, state, path)
        with torch.no_grad():
            for name, value in model.state_dict().items():
                value.copy_(state[name])
        return
    fitting(model, state, path)  # the first weight it lacks or shapes otherwise, named
    try:  # a model built on the meta device (to be sharded) takes the tensors themselves
        model.load_state_dict(state, assign=on_meta)
    except RuntimeError as error:
        problem = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
        raise ConfigError(f"bad value for '{KEY}': '{path}' does not fit the model: {problem}") from None


def fitting(model: nn.Module, state: Weights, path: str) -> Weights:
    """``state`` where it names every weight of ``model`` at its shape; else one line naming the first."""
    for name, value in model.state_dict().items():
        shape = (state.shape(name) if hasattr(state, "shape") else tuple(state[name].shape)) if name in state else None
        if shape != tuple(value.shape):
            found = "lacks" if shape is None else f"has shape {shape} for"
            raise ConfigError(
                f"bad value for '{KEY}': '{path}' {found} the model's weight '{name}' {tuple(value.shape)}"
            )
    return state


def sharded_files_whole(source: Path) -> None:
    """A sharded checkpoint given as ``model.weights`` has its metadata and every shard, whole."""
    try:
        check_shard_files(source)
    except CheckpointError as error:
        raise ConfigError(f"bad value for '{KEY}': {error}") from None


def _weights_file(source: Path, path: str) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: a ``.safetensors`` file, a trainrun checkpoint's model, or a saved
    state dict."""
    if source.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(source)
        except (OSError, SafetensorError) as error:
            raise ConfigError(f"bad value for '{KEY}': '{path}' is not a safetensors file ({error})") from None
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for damaged or foreign files
        raise ConfigError(
            f"bad value for '{KEY}': '{path}' is not a weights file (a trainrun checkpoint or a torch.save'd "
            f"state dict; torch.load says {load_failure(error)})"
        ) from None
    if isinstance(state, dict) and state.get("format") == CHECKPOINT_FORMAT:
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ConfigError(f"bad value for '{KEY}': '{path}' holds no state dict (names to tensors)")
    return state


def _hugging_face_state(bert: nn.Module, source: Path) -> dict[str, torch.Tensor]:
    """The state dict of the ``save_pretrained`` folder ``source`` read into ``bert``'s class and config."""
    try:
        with quiet_transformers():  # the mismatches are reported below, in one line
            loaded, info = type(bert).from_pretrained(
                source,
                config=bert.config,
                local_files_only=True,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
            )
    except (OSError, RuntimeError, ValueError) as error:
        raise ConfigError(f"bad value for '{KEY}': '{source}': {str(error).splitlines()[0]}") from None
    missing = sorted(info["missing_keys"])
    mismatched = sorted(entry[0] if isinstance(entry, tuple) else entry for entry in info["mismatched_keys"])
    if missing or mismatched:
        what = "lacks" if missing else "has another shape for"
        raise ConfigError(f"bad value for '{KEY}': '{source}' {what} the model's weight '{(missing or mismatched)[0]}'")
    return loaded.state_dict()


def export_pretrained(model: nn.Module, tokenizer_file: Path, directory: Path) -> list[str]:
    """Write trainrun's BERT and its tokenizer as a ``save_pretrained`` folder (atomically);
    return what ``transformers`` will not reproduce of the trained model."""
    with atomic_directory(directory) as partial:
        with quiet_transformers():
            model.bert.save_pretrained(partial)
        hugging_face_tokenizer(tokenizer_file).save_pretrained(partial)
    caveats = []
    if any(isinstance(module, GatedIntermediate) for module in model.modules()):
        caveats.append("its feed-forward layers are GLUs (gated_linear_units), which BertForMaskedLM cannot load")
    if getattr(model, "alibi_slopes", None) is not None:
        caveats.append("it was trained with ALiBi's distance biases, which transformers' BERT does not add")
    return caveats


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """``transformers`` without its progress bars and warnings (trainrun reports what matters)."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        logging.enable_progress_bar()


def hugging_face_tokenizer(tokenizer_file: Path):
    """A token store's tokenizer as ``transformers``' fast BERT tokenizer: its special tokens named,
    ``[CLS] … [SEP]`` added as BERT's tokenizer adds them (trainrun's data adds them itself, so the
    store's tokenizer has no template)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from trainrun.data.token_store import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_file)
    ids = {token: tokenizer.token_to_id(token) for token in ("[CLS]", "[SEP]")}
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=list(ids.items())
    )
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, mask_token="[MASK]", **specials)


def check_weights_file(model: nn.Module, path: str) -> None:
    """``model.weights``, a file, fits ``model`` (built on the meta device: shapes, no values), read before
    any process starts; one line naming the first weight it lacks or shapes otherwise."""
    source = Path(path).expanduser()
    if source.is_file():
        fitting(model, _weights_file(source, path), path)
