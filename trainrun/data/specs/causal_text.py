"""The spec of ``data=token_stream``: a token store read as one stream of windows (trainrun/data/causal_text.py)."""

from __future__ import annotations

from trainrun.data.specs.masked_text import check_loader, check_store_given
from trainrun.kinds import KindSpec

SPECS = (
    KindSpec(
        name="token_stream",
        builder="trainrun.data.causal_text:stream_datasets",
        batches="token_windows",
        check=check_loader,
        check_files=check_store_given,
    ),
)
