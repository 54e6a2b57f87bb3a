"""Registry entry for the SpecExit EAGLE3 draft class (see ``sglang_ext.engine.specexit.draft_models``)."""

from sglang_ext.engine.specexit.draft_models import EntryClass  # noqa: F401
