"""The README is a front page, and every pointer in the documentation resolves in the repository.

Checked: README.md's length, section order and Quick-start commands; in README.md, docs/*.md,
the configs' READMEs and the research kit's README, every relative Markdown link (and its
#anchor), and every repository path written in code (`configs/...`, `tools/...`,
`projects/...`).
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / 'README.md'
KIT = REPO / 'projects' / 'mst_research'
DOC_FILES = sorted([README, *(REPO / 'docs').glob('*.md'), *(REPO / 'configs').rglob('README.md'),
                    KIT / 'README.md'])
QUICK_START_COMMANDS = ['bash tools/run_demo.sh', 'bash tools/run_tests.sh']
# An OpenMMLab project README's order: what it is, how to run it, the status, usage, results.
FRONT_PAGE_SECTIONS = ['Quick start', 'Status', 'Data', 'Pretrain', 'Evaluate', 'Transfer',
                       'Results', 'Speed', 'License', 'Citation']
# Top-level folders whose paths, written in code spans or blocks, must exist.
REPO_DIRS = ('configs', 'tools', 'mst_mm', 'docs', 'tests', 'requirements', 'projects')

FENCE = re.compile(r'^```.*?^```', re.M | re.S)
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
CODE_SPAN = re.compile(r'`([^`\n]+)`')
REPO_PATH = re.compile(r'(?<![\w./-])((?:' + '|'.join(REPO_DIRS) + r')/[\w./-]*)')


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, '-' for ' '."""
    text = re.sub(r'[`*_]', '', heading.strip().lower())
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path: Path) -> set:
    text = FENCE.sub('', path.read_text())
    return {github_anchor(m.group(1)) for m in re.finditer(r'^#+\s+(.*)$', text, re.M)}


def relative_links(path: Path) -> list:
    text = FENCE.sub('', path.read_text())
    return [t for t in LINK.findall(text) if not re.match(r'[a-z]+:', t)]


def code_paths(path: Path) -> list:
    """Repository paths written in code blocks and code spans, placeholders left out."""
    text = path.read_text()
    # A block may open with a comment naming the file it shows the reader how to write
    # (`# configs/my_pretraining.py`): that file is not expected to exist.
    code = [re.sub(r'^\s*#\s*\S+\s*$', '', m.group(0), flags=re.M) for m in FENCE.finditer(text)]
    code += CODE_SPAN.findall(FENCE.sub('', text))
    found = []
    for chunk in code:
        for m in REPO_PATH.finditer(chunk):
            following = chunk[m.end():m.end() + 1]
            if following in ('{', '<', '*', '['):   # a pattern such as dist_{train,test}.sh
                continue
            found.append(m.group(1).split('::')[0].rstrip('.,:;'))
    return found


def test_readme_is_a_front_page_in_the_usual_order():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f'README.md has {len(lines)} lines: move detail into docs/'
    quick_start = lines.index('## Quick start')
    assert quick_start < 40, f'the Quick start begins at line {quick_start + 1}: not on screen 1'
    sections = [line[3:].strip() for line in lines if line.startswith('## ')]
    assert [s for s in sections if s in FRONT_PAGE_SECTIONS] == FRONT_PAGE_SECTIONS, sections
    assert (REPO / 'LICENSE').read_text().count('Apache License') >= 1
    assert '@inproceedings{' in README.read_text()


def test_quick_start_commands_come_first_and_unchanged():
    text = README.read_text()
    first_block = FENCE.search(text)
    assert first_block is not None
    heading_before = re.findall(r'^## (.*)$', text[:first_block.start()], re.M)[-1]
    assert heading_before == 'Quick start'
    commands = [line.split('#')[0].strip() for line in first_block.group(0).splitlines()[1:-1]]
    assert [c for c in commands if c] == QUICK_START_COMMANDS
    before = text[:first_block.start()]
    assert not any(c in before for c in QUICK_START_COMMANDS), (
        'a Quick-start command appears before the Quick start section')


def test_front_page_has_no_development_notes():
    text = ' '.join(' '.join(path.read_text().split()) for path in DOC_FILES)
    for note in ('ENVIRONMENT.md', 'shared/', 'at an earlier commit', 'before the last'):
        assert note not in text, note


@pytest.mark.parametrize('doc', DOC_FILES, ids=doc_id)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition('#')
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if REPO.resolve() not in resolved.parents and resolved != REPO.resolve():
            broken.append(f'{target} (outside the repository)')
        elif not resolved.exists():
            broken.append(f'{target} (no such file)')
        elif anchor and resolved.suffix == '.md' and anchor not in anchors(resolved):
            broken.append(f'{target} (no heading #{anchor} in {resolved.name})')
    assert not broken, f'{doc_id(doc)}: {broken}'


@pytest.mark.parametrize('doc', DOC_FILES, ids=doc_id)
def test_every_repository_path_in_code_exists(doc):
    missing = sorted({p for p in code_paths(doc) if not (REPO / p).exists()})
    assert not missing, f'{doc_id(doc)} names paths that do not exist: {missing}'


def test_the_checks_catch_broken_pointers(tmp_path):
    doc = tmp_path / 'x.md'
    doc.write_text('# Top\n\n[ok](#top) [bad](#nowhere) ![img](missing.png)\n\n'
                   '`configs/mst/` `tools/dist_{train,test}.sh` `configs/nope.py`\n'
                   '```\n# configs/yours.py\n[not a link](in_code.md) tools/gone.sh\n```\n')
    assert relative_links(doc) == ['#top', '#nowhere', 'missing.png']
    assert anchors(doc) == {'top'}
    assert code_paths(doc) == ['tools/gone.sh', 'configs/mst/', 'configs/nope.py']
    assert github_anchor('Is the run learning? Collapse diagnostics') == (
        'is-the-run-learning-collapse-diagnostics')


def test_citation_file_and_readme_cite_the_same_paper():
    import yaml

    with open(REPO / 'CITATION.cff') as f:
        paper = yaml.safe_load(f)['preferred-citation']
    bibtex = README.read_text().split('@inproceedings{', 1)[1].split('\n}', 1)[0]
    authors = re.search(r'author\s*=\s*\{(.*?)\},', bibtex, re.S).group(1)
    assert [a.split(',')[0].strip() for a in ' '.join(authors.split()).split(' and ')] == [
        a['family-names'] for a in paper['authors']]
    assert paper['title'] in bibtex.replace('{MST}', 'MST')
    assert f"volume    = {{{paper['volume']}}}" in bibtex and str(paper['year']) in bibtex


def test_user_pages_name_no_commit_hash():
    """History lives in CHANGELOG.md: README.md and docs/*.md name no commit (7-12 hex
    characters with a digit and a letter a-f) as the source of a figure."""
    commit = re.compile(r'\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b')
    assert commit.findall('at 0e60de1, run b (136edcc)') == ['0e60de1', '136edcc']
    assert not commit.findall('1024 decade 2026-11-27 deit-s_1thread_a.json sha256:' + 'a1' * 32)
    found = {doc_id(doc): sorted(set(commit.findall(doc.read_text())))
             for doc in [README, *(REPO / 'docs').glob('*.md')]}
    assert not {doc: hashes for doc, hashes in found.items() if hashes}, (
        'commit hashes in user pages; history belongs in CHANGELOG.md')
