"""`--draft-model`: a second model loaded beside the served one, whose drafts the batch
verifies (speculation/draft_model.py). It must share the served model's tokenizer; a load
that finds otherwise fails with the reason, as a bad model would."""

from __future__ import annotations

from collections.abc import Callable

from ...speculation.draft_model import DraftModelError, check_draft_pair
from .host import LoadedModel, load_model
from .sources import ModelLoadError


def with_draft_model(load: Callable[..., LoadedModel], draft_source: str) -> Callable:
    """`load` (a model loader, as `load_model`), then the draft model beside its model."""

    def loader(source, fim_template=None, cluster=None, policy=None, **options) -> LoadedModel:
        loaded = load(source, fim_template, cluster, policy, **options)
        draft = load_model(
            draft_source, "none", None, policy, between=options.get("between"), calibrate=False
        )
        try:
            check_draft_pair(draft.model, draft.tokenizer.get_vocab(), loaded.tokenizer.get_vocab())
        except DraftModelError as error:
            raise ModelLoadError(f"--draft-model {draft_source} for {source}: {error}") from None
        loaded.draft = draft
        loaded.draft_kv_share = draft.kv_bytes_per_token / max(1, loaded.kv_bytes_per_token)
        loaded.kv_bytes_per_token += draft.kv_bytes_per_token  # a sequence holds both
        return loaded

    return loader
