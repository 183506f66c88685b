"""The layout that docs/contributing.md describes: the plugin (``mst_mm``) imports one way,
from the top (converters, engine) down to models, never the research kit; the plugin's tools
(tools/) and tests (tests/) use no kit, whose tools and tests live in projects/mst_research/;
every tool is thin and stands alone."""
import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from tests.helpers import REPO

PACKAGE = REPO / 'mst_mm'
KIT = REPO / 'projects' / 'mst_research'
# Each sub-package may import the ones of a lower rank only (the leaf modules are rank 0).
RANKS = {'compat': 0, 'dependencies': 0, 'errors': 0, 'version': 0, 'models': 1, 'datasets': 2,
         'evaluation': 2, 'visualization': 2, 'engine': 3, 'utils': 4, 'converters': 5}


def mst_mm_imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) of every ``mst_mm`` module that ``path`` imports."""
    package = '.'.join(path.relative_to(REPO).with_suffix('').parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not node.level:
                yield node.lineno, node.module
                continue
            base = '.'.join(package.split('.')[:len(package.split('.')) - node.level + 1])
            if node.module:
                yield node.lineno, f'{base}.{node.module}'
            else:   # from . import a, b: the sub-modules
                yield from ((node.lineno, f'{base}.{alias.name}') for alias in node.names)


def test_the_plugin_imports_downward_only_and_never_itself_or_the_kit():
    wrong = []
    for path in sorted(PACKAGE.rglob('*.py')):
        if '.mim' in path.parts:  # configs and tools, linked or copied for `mim`
            continue
        own = path.relative_to(PACKAGE).parts[0].removesuffix('.py')
        for line, name in mst_mm_imports(path):
            where = f'{path.relative_to(REPO)}:{line} imports {name}'
            if name.split('.')[0] == 'mst_research':
                wrong.append(where + ' (the kit uses the plugin, not the other way)')
            elif name == 'mst_mm':
                wrong.append(where + ' (the package is already imported)')
            elif name.startswith('mst_mm.') and own != '__init__':
                other = name.split('.')[1]
                if other != own and RANKS[other] >= RANKS[own]:
                    wrong.append(where + f' (rank {RANKS[other]} >= {RANKS[own]})')
    assert not wrong, '\n'.join(wrong)


def test_the_package_init_imports_only_what_registers():
    tree = ast.parse((PACKAGE / '__init__.py').read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == {'check_dependencies', 'datasets', 'engine', 'evaluation', 'models',
                        '__version__'}


def test_importing_the_plugin_imports_neither_the_kit_nor_the_converters_nor_the_tools_code():
    script = ('import sys, mst_mm; print(sorted(m for m in sys.modules '
              "if m.startswith(('mst_research', 'mst_mm.converters', 'mst_mm.utils'))))")
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         check=True, cwd=REPO.parent).stdout
    assert out.strip() == '[]'


PLUGIN_TOOLS = sorted((REPO / 'tools').rglob('*.py'))
KIT_TOOLS = sorted((KIT / 'tools').rglob('*.py'))
TOOLS = PLUGIN_TOOLS + KIT_TOOLS
# The kit's command lines that tools/ still holds: docs/install.md, tools/run_demo.sh and
# tools/collect_device_wheels.sh name them there.
def imports_the_kit(path: Path) -> bool:
    return any(name and name.split('.')[0] == 'mst_research'
               for _, name in mst_mm_imports(path))


def user_tools() -> list:
    """setup.py's USER_TOOLS (what the wheel carries for `mim`), read without running it."""
    for node in ast.parse((REPO / 'setup.py').read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', '') == 'USER_TOOLS':
            return list(ast.literal_eval(node.value))
    raise AssertionError('setup.py defines no USER_TOOLS')


def test_the_kits_tools_live_in_the_kit_and_the_user_tools_use_no_kit():
    in_tools = {str(p.relative_to(REPO)) for p in PLUGIN_TOOLS if imports_the_kit(p)}
    assert not in_tools, (
        'a tool in tools/ that imports mst_research belongs in projects/mst_research/tools/')
    user = [p for name in user_tools() for p in
            ([REPO / 'tools' / name] if name.endswith('.py')
             else sorted((REPO / 'tools' / name).rglob('*.py')))]
    assert REPO / 'tools' / 'train.py' in user and all(p.is_file() for p in user), user
    assert not [str(p.relative_to(REPO)) for p in user if imports_the_kit(p)]
    assert KIT_TOOLS and all(imports_the_kit(p) for p in KIT_TOOLS)


def test_the_plugins_tests_use_no_kit_and_the_kits_tests_no_plugin_test():
    plugin = [str(p.relative_to(REPO)) for p in sorted((REPO / 'tests').rglob('*.py'))
              if imports_the_kit(p)]
    assert not plugin, f'kit tests (their place: projects/mst_research/tests): {plugin}'
    kit_tests = sorted((KIT / 'tests').rglob('*.py'))
    assert len(kit_tests) >= 10
    assert not [str(p.relative_to(REPO)) for p in kit_tests
                if any(name and name.split('.')[0] == 'tests'
                       for _, name in mst_mm_imports(p))]
    # No package there: a second package named `tests` would shadow the plugin's.
    assert not (KIT / 'tests' / '__init__.py').exists()
    testpaths = re.search(r'^testpaths\s*=\s*\[(.*?)\]', (REPO / 'pyproject.toml').read_text(),
                          re.M | re.S)
    assert testpaths and re.findall(r'"([^"]+)"', testpaths.group(1)) == [
        'tests', 'projects/mst_research/tests'], 'pytest must collect both test folders'


def test_the_plugins_configs_use_no_kit():
    """No config in configs/ imports the kit or names it in custom_imports: the wheel carries
    configs/ for `mim`, without the kit (its configs are in projects/mst_research/configs)."""
    def uses_the_kit(path: Path) -> bool:
        return any(isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value.split('.')[0] == 'mst_research'
                   for node in ast.walk(ast.parse(path.read_text()))) or imports_the_kit(path)
    configs = sorted((REPO / 'configs').rglob('*.py'))
    assert len(configs) > 20
    assert not [str(p.relative_to(REPO)) for p in configs if uses_the_kit(p)]


@pytest.mark.parametrize('path', TOOLS, ids=lambda p: str(p.relative_to(REPO)))
def test_tools_are_thin_and_stand_alone(path):
    source = path.read_text()
    assert len(source.splitlines()) <= 300
    other_tools = {tool.stem for tool in TOOLS} - {path.stem}
    for node in ast.walk(ast.parse(source)):
        where = f'{path.relative_to(REPO)}:{getattr(node, "lineno", "?")}'
        if isinstance(node, ast.Attribute) and node.attr == 'path':
            assert not (isinstance(node.value, ast.Name) and node.value.id == 'sys'), \
                f'{where} edits sys.path'
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) \
                else [node.module or '']
            assert not other_tools & {name.split('.')[0] for name in names}, \
                f'{where} imports another tool'
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not (node.value.startswith(('tools/', 'projects/mst_research/tools/'))
                        and node.value.endswith('.py')
                        and 'spec_from_file_location' in source), f'{where} loads a tool'


#: Test files at the top of tests/: the package's top-level modules (compat, and __init__ with
#: dependencies: test_plugin_import) and the tiers that cut across it (the GPU tests, and the
#: CPU test of their probe hooks).
TOP_LEVEL_TESTS = {'test_compat.py', 'test_plugin_import.py', 'test_cuda.py',
                   'test_gpu_probe_hooks.py'}


def test_the_plugins_tests_mirror_the_package():
    """tests/test_<sub-package>/ for each sub-package of mst_mm (test_models/test_<part>/ for
    the model parts), test_tools/ for the user tools, test_repository/ for the checks of docs,
    configs, layout and stack; at the top only TOP_LEVEL_TESTS."""
    def packages(folder: Path) -> set:
        return {f'test_{p.name}' for p in folder.iterdir() if (p / '__init__.py').is_file()}

    areas = packages(PACKAGE) | {'test_tools', 'test_repository'}
    misplaced = []
    for path in sorted((REPO / 'tests').rglob('test_*.py')):
        parts = path.relative_to(REPO / 'tests').parts
        if len(parts) == 1:
            fits = parts[0] in TOP_LEVEL_TESTS
        else:
            fits = parts[0] in areas and (
                parts[0] != 'test_models' or len(parts) == 3
                and parts[1] in packages(PACKAGE / 'models'))
        if not fits:
            misplaced.append(str(path.relative_to(REPO)))
    assert not misplaced, misplaced
