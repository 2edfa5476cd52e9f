"""The user-facing error types: the CLI prints these as one line (no traceback) and exits 2."""

from __future__ import annotations

from configs.models import ConfigError
from storage.catalog import QueryError
from storage.lake import LakeError


class UserError(Exception):
    """Bad input from the user (arguments, files): one clear line."""


USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ConfigError, LakeError, QueryError)
