from .algorithms import *  # noqa: F401,F403
from .backbones import *  # noqa: F401,F403
from .heads import *  # noqa: F401,F403
from .necks import *  # noqa: F401,F403
from .utils import *  # noqa: F401,F403
