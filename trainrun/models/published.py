"""A published Hugging Face folder's config and tensors, for ``model.weights=FOLDER``.

The tensors are read when asked for, one at a time, from the safetensors files (``model.safetensors``,
or the shards ``model.safetensors.index.json`` names), and a sharded model's rank reads only its
rows of each (:meth:`PublishedTensors.rows`): an 8B model's 16 GB are never whole in a process.
safetensors maps each file and reads a tensor's bytes, or a slice's, where they lie.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from trainrun.atomic_io import read_json
from trainrun.errors import ConfigError
from trainrun.models.weights import KEY, quiet_transformers


def published_config(source: Path):  # noqa: ANN201
    """The ``transformers`` config of a published folder (its ``config.json``), or one line."""
    from transformers import AutoConfig

    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"bad value for '{KEY}': '{source}': {str(error).splitlines()[0]}") from None


class PublishedTensors(Mapping[str, torch.Tensor]):
    """The tensors of a published folder by their names there, each read when asked for."""

    def __init__(self, source: Path) -> None:
        from safetensors import SafetensorError, safe_open

        index = source / "model.safetensors.index.json"
        try:
            named = read_json(index)["weight_map"] if index.is_file() else None
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"bad value for '{KEY}': '{index}' is not a safetensors index (weight_map)") from None
        self.files: dict[str, Path] = {}
        for file in sorted(set(named.values())) if named else ["model.safetensors"]:
            path = source / file
            if not path.is_file():
                raise ConfigError(f"bad value for '{KEY}': '{source}' has no {file} (safetensors weights)")
            try:
                with safe_open(path, framework="pt") as opened:
                    self.files |= dict.fromkeys(opened.keys(), path)
            except (SafetensorError, OSError) as error:
                raise ConfigError(f"bad value for '{KEY}': '{path}': {error}") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as opened:
            return opened.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as opened:
            return tuple(opened.get_slice(name).get_shape())

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start`` to ``stop`` of tensor ``name`` (the first dimension's), read alone."""
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as opened:
            return opened.get_slice(name)[start:stop]


class Renamed(Mapping[str, torch.Tensor]):
    """``tensors`` under trainrun's names: ``names`` maps each of trainrun's to the folder's."""

    def __init__(self, tensors: PublishedTensors, names: dict[str, str]) -> None:
        self.tensors, self.names = tensors, names

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[self.names[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors.shape(self.names[name])

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.tensors.rows(self.names[name], start, stop)


def same_tokenizer(source: Path, tokenizer_file: Path | None) -> None:
    """A published folder's ``tokenizer.json`` against the data's (the store's, or token shards'):
    the vocabulary's size, each special token's id, then every token's; one line on the first
    difference (the data was written with another tokenizer: the model would read ids it did not
    learn for those tokens)."""
    published = source / "tokenizer.json"
    if tokenizer_file is None or not published.is_file():
        return
    from trainrun.data.token_store import load_tokenizer

    theirs, ours = load_tokenizer(published), load_tokenizer(tokenizer_file)
    if theirs.get_vocab_size() != ours.get_vocab_size():
        raise ConfigError(
            f"bad value for '{KEY}': '{published}' has {theirs.get_vocab_size():,} tokens, the data's tokenizer "
            f"'{tokenizer_file}' {ours.get_vocab_size():,} (write the data with --tokenizer {published})"
        )
    special = {token.content: index for index, token in theirs.get_added_tokens_decoder().items() if token.special}
    for content, index in special.items():
        found = ours.token_to_id(content)
        if found != index:
            raise ConfigError(
                f"bad value for '{KEY}': '{published}' has the special token {content!r} at id {index}, the data's "
                f"tokenizer '{tokenizer_file}' at {found} (write the data with --tokenizer {published})"
            )
    mine = ours.get_vocab()
    other = next((token for token, index in theirs.get_vocab().items() if mine.get(token) != index), None)
    if other is not None:
        raise ConfigError(
            f"bad value for '{KEY}': '{published}' gives {other!r} id {theirs.token_to_id(other)}, the data's "
            f"tokenizer '{tokenizer_file}' {mine.get(other)} (write the data with --tokenizer {published})"
        )
