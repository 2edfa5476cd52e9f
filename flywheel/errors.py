"""The user-facing error types: the CLI prints these as one line (no traceback) and exits 2."""

from __future__ import annotations

from configs.models import ConfigError
from flywheel.query import QueryError
from flywheel.runtime.rollout import RolloutError
from storage.lake import LakeError
from training.models import ModelError
from training.rl_settings import SDPOTeacherError
from viewer.data import ViewerError


class UserError(Exception):
    """Bad input from the user (arguments, files): one clear line."""


# RolloutError (the runner could not start its workers), ModelError (a model folder or Hub id that cannot
# load) and SDPOTeacherError (rl.sdpo_teacher_check) already carry one line naming the cause; a traceback
# adds nothing a user can act on.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    ConfigError,
    LakeError,
    QueryError,
    RolloutError,
    ModelError,
    SDPOTeacherError,
    ViewerError,
)
