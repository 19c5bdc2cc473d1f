"""The one exception type for errors a user can cause; the CLI turns it into one line and exit status 2."""


class AttnscopeError(Exception):
    """A problem with the user's input, model, device or output path, worded so it can be shown as is."""


class NoLanguageModelHead(AttnscopeError):
    """A checkpoint saved without its language-model head, asked for one (`load` then takes the base model alone)."""
