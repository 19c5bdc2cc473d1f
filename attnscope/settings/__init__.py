"""Every command's settings, each declared once: one frozen dataclass per command, a field per setting.

Each field is declared with `options.setting` (its domain, default, help and command-line spelling), and from that
one declaration come the field's check, the Python API's keyword with its docstring line (attnscope.api) and the
CLI's option (attnscope.cli). Settings shared by several commands are declared once, in the small classes the
commands inherit (`Reading`: --file, --bos; `Batching`; `Scoring`; `Place`, `Revision`, `DeviceMap`, `Kernel`: how
a model given by name is loaded).

A command's class also declares its contract, as class attributes with defaults on `Settings` (the way
transformers' PreTrainedModel declares `_supports_sdpa`): which models it takes (`models`), whether it reads texts,
whether it needs the language-model head, whether it draws pictures, and what it asks of a model's shape
(`check_shape`, from the config before any weight loads). The runners (attnscope.api) read these attributes; they
never probe an analysis with getattr. The analyses (attnscope.analyses) subclass these classes and add `run`.

Light: no torch, no transformers, so `attnscope --help` builds every option from here.
"""

from attnscope.settings import declare, describe, groups, intervene, plan, several, tools
from attnscope.settings.declare import *  # noqa: F403 (each module names what it offers in its __all__)
from attnscope.settings.describe import *  # noqa: F403
from attnscope.settings.groups import *  # noqa: F403
from attnscope.settings.intervene import *  # noqa: F403
from attnscope.settings.plan import *  # noqa: F403
from attnscope.settings.several import *  # noqa: F403
from attnscope.settings.tools import *  # noqa: F403

__all__ = [name for module in (declare, groups, describe, intervene, plan, several, tools) for name in module.__all__]
