"""What the documents name exists and agrees: tools' flags, files, paper numbers.

Checked in README.md, docs/*.md, the configs' READMEs and the research kit's README
(tests/test_repository/test_docs.py's list):

- every ``--flag`` written after a ``tools/...py`` or ``tools/...sh`` command (the plugin's
  or the kit's ``projects/mst_research/tools/``), in a code block
  or a code span, is one that the tool accepts (its argparse parser, or the script's ``case``
  labels, or the tool a script passes its arguments to), and none is a hidden one
  (``help=argparse.SUPPRESS``): a hidden flag is internal and is not documented anywhere;
- every Python file named by its bare name in code (``knn_vit-tiny-48_animals.py``) exists
  somewhere in the repository;
- the paper's numbers quoted for a row of its Table 4 are the paper's, and the same on every
  page.

Each check is shown to fail on a planted error (``test_the_checks_catch_*``).
"""
import argparse
import functools
import re
from pathlib import Path
from unittest import mock

import pytest

from tests.helpers import load_tool
from tests.test_repository.test_docs import DOC_FILES, FENCE, REPO, doc_id

# The plugin's tools (tools/) and the research kit's (projects/mst_research/tools/).
TOOL_FOLDERS = (REPO / 'tools', REPO / 'projects' / 'mst_research' / 'tools')
TOOL = re.compile(
    r'(?<![\w./-])((?:projects/mst_research/)?tools/[\w/.-]+?\.(?:py|sh))(?![\w/.-])')
FLAG = re.compile(r'(?<![\w-])(--[A-Za-z][\w-]*)')
# A code span may run over a line break, not over a paragraph.
CODE_SPAN = re.compile(r'`((?:[^`\n]|\n(?![ \t]*\n))+)`')
SEPARATORS = re.compile(r'&&|\|\||[|;]')
BARE_PY = re.compile(r'(?<![\w/.:-])([\w-][\w.-]*\.py)(?![\w/])')
# Files that documents name but that are not this repository's: DINO's scripts.
EXTERNAL_PY = {'main_dino.py', 'eval_knn.py', 'eval_linear.py', 'utils.py',
               'vision_transformer.py'}


def code_chunks(text: str) -> list:
    """(line number, command line) of every code-block line (continuations joined) and of
    every code span (line breaks made spaces)."""
    chunks = []
    for block in FENCE.finditer(text):
        first = text.count('\n', 0, block.start()) + 1
        body = block.group(0).split('\n')[1:-1]
        joined, start = '', None
        for offset, line in enumerate(body, start=1):
            start = start or first + offset
            if line.rstrip().endswith('\\'):
                joined += line.rstrip()[:-1] + ' '
                continue
            chunks.append((start, joined + line))
            joined, start = '', None
    outside = FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    for span in CODE_SPAN.finditer(outside):
        chunks.append((outside.count('\n', 0, span.start()) + 1,
                       ' '.join(span.group(1).split())))
    return chunks


def strip_comment(line: str) -> str:
    return re.split(r'(?:^|\s)#', line, maxsplit=1)[0]


def documented_commands(text: str) -> list:
    """(line, tool, [flags]) for every ``tools/...`` command in the code of a document."""
    found = []
    for line_no, line in code_chunks(text):
        line = strip_comment(line)
        tools = list(TOOL.finditer(line))
        for i, tool in enumerate(tools):
            end = tools[i + 1].start() if i + 1 < len(tools) else len(line)
            args = SEPARATORS.split(line[tool.end():end])[0]
            flags = [m.group(1) for m in FLAG.finditer(args)]
            found.append((line_no, tool.group(1), flags))
    return found


class _Parsed(Exception):
    pass


def _parser_of(module) -> argparse.ArgumentParser:
    """The parser a tool builds, caught as it starts to parse (nothing else of it runs)."""
    if hasattr(module, 'build_parser'):
        return module.build_parser()
    caught = []

    def catch(self, *args, **kwargs):
        caught.append(self)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, 'parse_args', catch), \
            mock.patch.object(argparse.ArgumentParser, 'parse_known_args', catch):
        for name in ('parse_args', 'main'):
            entry = getattr(module, name, None)
            if entry is None:
                continue
            for args in ([[]], []):
                try:
                    entry(*args)
                except _Parsed:
                    return caught[-1]
                except TypeError:   # main() without an argv parameter
                    continue
    raise AssertionError(f'{module.__file__}: no argparse parser found')


@functools.lru_cache(maxsize=None)
def tool_flags(tool: str):
    """(accepted, hidden) option strings of ``tools/...``; accepted is None for a script
    that passes any argument on to a program that is not one of our tools (pytest)."""
    path = REPO / tool
    if tool.endswith('.py'):
        parser = _parser_of(load_tool(tool))
        accepted = {s for a in parser._actions for s in a.option_strings}
        hidden = {s for a in parser._actions for s in a.option_strings
                  if a.help == argparse.SUPPRESS}
        return frozenset(accepted), frozenset(hidden)
    code = [strip_comment(line) for line in path.read_text().splitlines()]
    accepted = set()
    for line in code:
        label = re.match(r'\s*([-\w|]+)\)', line)
        if label:
            accepted |= {s for s in label.group(1).split('|') if s.startswith('--')}
    hidden = set()
    if any(('"$@"' in line or '${@' in line or 'PY_ARGS' in line) for line in code):
        targets = {name for line in code for name in re.findall(r'([\w-]+\.py)\b', line)}
        paths = [p for name in targets for folder in TOOL_FOLDERS for p in folder.rglob(name)]
        if not paths:
            return None, frozenset()
        for target in paths:
            more, more_hidden = tool_flags(str(target.relative_to(REPO)))
            accepted |= more
            hidden |= more_hidden
    return frozenset(accepted), frozenset(hidden)


def flag_problems(doc: Path) -> list:
    text = doc.read_text()
    problems = []
    for line_no, tool, flags in documented_commands(text):
        if not (REPO / tool).is_file():
            continue   # a missing tool is test_docs.py's test_every_repository_path_in_code_exists
        accepted, hidden = tool_flags(tool)
        for flag in flags:
            if flag in hidden:
                problems.append(f'line {line_no}: {tool} {flag} is a hidden (internal) flag')
            elif accepted is not None and flag not in accepted:
                problems.append(f'line {line_no}: {tool} has no flag {flag}')
    return problems


def all_tools() -> list:
    return sorted(str(p.relative_to(REPO)) for pattern in ('*.py', '*.sh')
                  for p in (REPO / 'tools').rglob(pattern))


def hidden_flag_mentions(doc: Path) -> list:
    """Hidden flags of any tool written anywhere in a document's code, unless some tool
    accepts the same flag openly."""
    hidden, visible = set(), set()
    for tool in all_tools():
        accepted, tool_hidden = tool_flags(tool)
        hidden |= tool_hidden
        visible |= (accepted or set()) - tool_hidden
    secret = hidden - visible
    return [f'line {line_no}: {flag} is a hidden (internal) flag'
            for line_no, line in code_chunks(doc.read_text())
            for flag in FLAG.findall(line) if flag in secret]


@functools.lru_cache(maxsize=None)
def repository_py_names() -> frozenset:
    skip = {'.venv', '.git', 'work_dirs', 'data', 'node_modules', '.mim'}
    return frozenset(p.name for p in REPO.rglob('*.py') if not skip & set(p.parts))


def missing_py_names(doc: Path) -> list:
    missing = []
    for line_no, line in code_chunks(doc.read_text()):
        for name in BARE_PY.findall(line):
            before = line[:line.index(name)]
            if re.search(r'(mmdet|mmseg|mmpretrain|mmengine)::\S*$', before):
                continue   # a framework's config
            if name[:-3].isupper():
                continue   # a placeholder: CONFIG.py, NAME.py
            if name not in repository_py_names() and name not in EXTERNAL_PY:
                missing.append(f'line {line_no}: {name}')
    return sorted(set(missing))


@pytest.mark.parametrize('doc', DOC_FILES, ids=doc_id)
def test_documented_flags_are_accepted_and_not_hidden(doc):
    problems = flag_problems(doc) + hidden_flag_mentions(doc)
    assert not problems, f'{doc_id(doc)}: ' + '; '.join(problems)


@pytest.mark.parametrize('doc', DOC_FILES, ids=doc_id)
def test_every_python_file_named_in_code_exists(doc):
    missing = missing_py_names(doc)
    assert not missing, f'{doc_id(doc)} names files that do not exist: {missing}'


def test_the_checks_catch_undocumented_and_hidden_flags(tmp_path):
    doc = tmp_path / 'x.md'
    doc.write_text(
        '```bash\n'
        'python tools/train.py CONFIG --resume --no-such-flag  # --comment-flag\n'
        'bash tools/dist_train.sh CONFIG 8 --resume \\\n'
        '    --work-dir w --bogus\n'
        'python projects/mst_research/tools/evidence.py --quick --units a,b\n'
        'bash tools/setup_env.sh --ops --nope && python tools/test.py C K --out r.pkl\n'
        'python -m pytest --anything && bash tools/run_tests.sh -x --lf\n'
        '```\n'
        'and in a span `python tools/analysis/knn_eval.py C K\n--local-rank 0`, or `--units` '
        'alone, or `python projects/mst_research/tools/write_animal_shapes.py out --seed 1\n'
        '--size 3`.\n')
    assert sorted(flag_problems(doc)) == sorted([
        'line 2: tools/train.py has no flag --no-such-flag',
        'line 3: tools/dist_train.sh has no flag --bogus',
        'line 5: projects/mst_research/tools/evidence.py --units is a hidden (internal) flag',
        'line 6: tools/setup_env.sh has no flag --nope',
        'line 9: tools/analysis/knn_eval.py --local-rank is a hidden (internal) flag',
        'line 10: projects/mst_research/tools/write_animal_shapes.py has no flag --size'])
    # --local-rank is tools/test.py's open flag, so only --units counts as a secret.
    assert hidden_flag_mentions(doc) == ['line 5: --units is a hidden (internal) flag',
                                         'line 10: --units is a hidden (internal) flag']
    assert tool_flags('tools/run_tests.sh') == (None, frozenset())   # pytest takes the rest


def test_the_checks_catch_missing_python_files(tmp_path):
    doc = tmp_path / 'x.md'
    doc.write_text('Use `knn_vit-tiny-48_animals.py` or `knn_vit-tiny-12_gone.py`; `NAME.py`, '
                   "`_base_ = 'mmdet::swin/not_ours.py'`\n"
                   '```\npython train.py missing_config.py\n```\n')
    assert missing_py_names(doc) == ['line 1: knn_vit-tiny-12_gone.py',
                                     'line 3: missing_config.py']


# The paper's Table 4 (linear top-1 %, DeiT-S, 100 epochs), read off the paper: a row label
# and the value the paper gives it.
PAPER_TABLE_4 = {'attention-guided': 73.7, 'random mask': 63.2}
NUMBER = re.compile(r'(?<![\d.])(\d{2}\.\d)(?![\d.])')


def table_4_quotes(doc: Path) -> list:
    """(label, value, line) for each Table 4 row label that a number precedes closely, in a
    paragraph or table row that names Table 4."""
    text = doc.read_text()
    quotes = []
    for chunk in re.finditer(r'(?:[^\n]+\n?)+', FENCE.sub('', text)):
        body = chunk.group(0)
        if 'Table 4' not in body:
            continue
        for label in PAPER_TABLE_4:
            for hit in re.finditer(re.escape(label), body, re.IGNORECASE):
                window = body[max(0, hit.start() - 80):hit.start()]
                numbers = NUMBER.findall(window)
                if numbers:
                    line = text.count('\n', 0, text.find(body)) + 1
                    quotes.append((label, float(numbers[-1]), line))
    return quotes


def paper_number_problems(docs) -> list:
    problems = []
    for doc in docs:
        for label, value, line in table_4_quotes(doc):
            if value != PAPER_TABLE_4[label]:
                problems.append(f'{doc.name}:{line}: Table 4 "{label}" quoted as {value}, the '
                                f'paper gives {PAPER_TABLE_4[label]}')
    return problems


def test_paper_numbers_quoted_for_table_4_agree_on_every_page():
    assert not paper_number_problems(DOC_FILES)
    quoted = {doc_id(d) for d in DOC_FILES if table_4_quotes(d)}
    assert {'configs/mst/README.md', 'docs/swin_guidance.md'} <= quoted   # the check reads them


def test_the_checks_catch_a_paper_number_with_two_values(tmp_path):
    one, two = tmp_path / 'one.md', tmp_path / 'two.md'
    one.write_text("The paper's Table 4 gives 63.2 % with random masking and\n"
                   '73.7 % with the attention-guided mask.\n')
    two.write_text("| x | 73.9 (Table 4's attention-guided mask) |\n")
    assert table_4_quotes(one) == [('attention-guided', 73.7, 1), ('random mask', 63.2, 1)]
    assert paper_number_problems([one, two]) == [
        'two.md:1: Table 4 "attention-guided" quoted as 73.9, the paper gives 73.7']
