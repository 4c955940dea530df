"""The one error type of the study runner."""


class StudyError(ValueError):
    """A study that cannot run; the message is one line naming the file, flag or run at fault."""
