"""What can go wrong when profiling a dataset; each message says what was found and what to do next."""

from __future__ import annotations

from hpcmem.errors import HpcmemError


class LengthsError(HpcmemError):
    """Base of the length profiler's errors (the CLI prints them without a traceback)."""


class DataNotFound(LengthsError):
    """DATA is neither a file, a `save_to_disk` folder, nor a dataset in the local cache."""


class UnknownFormat(LengthsError):
    """A file whose extension is not one of the supported formats."""


class MissingColumn(LengthsError):
    """The dataset lacks the columns the chosen trainer reads."""


class EmptyDataset(LengthsError):
    """The dataset (or split) has no rows."""


class TokenizerNotFound(LengthsError):
    """--tokenizer is not a local tokenizer folder nor a tokenizer in the local cache."""


class TokenizerUnfit(LengthsError):
    """The tokenizer lacks what TRL needs for this data: a chat template (chats) or an EOS token (plain text)."""


class ProfileError(LengthsError):
    """A profile JSON that is not `hpcmem.lengths/1`, or a question it cannot answer."""


class ProcessorUnfit(LengthsError):
    """--processor is not a vision-language processor hpcmem counts, or its resolution settings are bad."""
