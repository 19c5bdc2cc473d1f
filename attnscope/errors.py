"""The exception for errors a user can cause, and two kinds of it; the CLI turns each into one line, exit 2."""


class AttnscopeError(Exception):
    """A problem with the user's input, model, device or output path, worded so it can be shown as is."""


class NoLanguageModelHead(AttnscopeError):
    """A checkpoint saved without its language-model head, asked for one (`load` then takes the base model alone)."""


class RendezvousError(AttnscopeError):
    """This process could not meet the others that torchrun (or a hand-set WORLD_SIZE) says it has: an error of its
    own, not one every process meets alike, so every process that meets it says it, with its rank."""
