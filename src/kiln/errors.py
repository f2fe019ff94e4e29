"""Every error kiln raises: `KilnError` subclasses are the user's to fix, `InternalError` is ours."""


class KilnError(Exception):
    """Base of user-facing errors: the message says what is wrong and how to fix it."""

    exit_code = 1


class ModelError(KilnError):
    """The model file is not a valid or loadable ONNX model."""


class ShapeError(ModelError):
    """Shapes in the model cannot match."""


class UnsupportedOpError(ModelError):
    """An ONNX op (or one of its features) kiln cannot import."""


class ResourceLimitError(KilnError):
    """A size, count or memory budget would be exceeded."""


class SecurityError(KilnError):
    """A file tries to read or write outside the places the user named."""


class PlanError(KilnError):
    """A plan file is truncated, corrupted, or not a kiln plan."""


class EngineCompatibilityError(PlanError):
    """A plan was built for another device or software versions."""


class SignatureError(PlanError):
    """A plan is unsigned, or its signature does not verify with the configured key."""


class InputError(KilnError):
    """Inference inputs do not match what the engine expects."""


class ConfigError(KilnError):
    """A build or run option is invalid or cannot be honoured."""


class InternalError(Exception):
    """A bug in kiln itself; please report it with the model that triggered it."""

    exit_code = 70
