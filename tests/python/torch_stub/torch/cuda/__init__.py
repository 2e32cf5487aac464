from . import memory  # noqa: F401
