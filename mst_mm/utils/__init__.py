"""What the user tools in tools/ share: their command line and their error reporting.
``import mst_mm`` does not import it."""
from .cli import (
    add_cfg_options_argument,
    check_cfg_options,
    check_test_config,
    merge_cfg_options,
    run_tool,
)

__all__ = ['add_cfg_options_argument', 'check_cfg_options', 'check_test_config',
           'merge_cfg_options', 'run_tool']
