import subprocess
import sys

from workbench.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for command in ("corpus", "report"):
        assert command in out


def test_corpus_synthetic_and_stats(tmp_path, capsys):
    assert main(["corpus", "synthetic", "--out", str(tmp_path), "--num-cuts", "500"]) == 0
    assert (tmp_path / "cuts.jsonl.gz").exists()
    assert main(["corpus", "stats", str(tmp_path / "cuts.jsonl.gz")]) == 0
    assert '"cuts": 500' in capsys.readouterr().out


def test_user_errors_are_one_line_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "duration": 1}\n{"id": \n')
    proc = subprocess.run([sys.executable, "-m", "workbench", "corpus", "stats", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "bad.jsonl:2: malformed JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "workbench", "corpus", "stats", str(tmp_path / "x.jsonl")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "x.jsonl: no such manifest" in missing.stderr


def test_corpus_tokenizer_adds_counts(tmp_path, capsys):
    assert main(["corpus", "synthetic", "--out", str(tmp_path), "--num-cuts", "2000"]) == 0
    out = tmp_path / "with_counts.jsonl.gz"
    assert main(["corpus", "tokenizer", str(tmp_path / "cuts.jsonl.gz"), "--vocab-size", "128",
                 "--add-counts", str(out)]) == 0
    from workbench.data import read_cut_arrays
    from workbench.data.tokenizer import count_tokens, load_tokenizer

    arrays = read_cut_arrays(out, with_texts=True, progress=False)
    model = next(tmp_path.glob("*.model"))
    assert (arrays.num_tokens == count_tokens(load_tokenizer(model), arrays.texts)).all()


def test_cli_starts_without_importing_torch():
    code = "import sys, workbench.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "a sub-command module imports torch at start-up: import it inside the command"


def test_test_modules_have_unique_names():
    """pytest's default import mode needs unique basenames across test folders (no __init__.py)."""
    from collections import Counter
    from pathlib import Path

    names = Counter(p.name for p in (Path(__file__).parent).rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []


def _command_paths(parser, prefix=()):
    """Every command and sub-command of the parser, as argument lists (e.g. ["corpus", "tts"])."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield [*prefix, name]
                yield from _command_paths(sub, (*prefix, name))


def test_help_of_every_command_exits_0_without_traceback(capsys):
    from workbench.cli import build_parser

    paths = list(_command_paths(build_parser()))
    assert ["bins"] in paths and ["corpus", "tts"] in paths
    for path in [[], *paths]:
        assert main([*path, "--help"]) == 0, path
        out = capsys.readouterr()
        assert "usage:" in out.out and "Traceback" not in out.out + out.err, path


def _parsers():
    """(path, parser) for every command and sub-command."""
    import argparse

    from workbench.cli import build_parser

    root = build_parser()
    for path in _command_paths(root):
        parser = root
        for name in path:
            parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        yield path, parser


def test_every_option_says_what_it_means_and_its_default():
    import argparse

    for path, parser in _parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), (path, name)
            if action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in action.help, (path, name, action.default)


def test_every_command_help_has_examples(capsys):
    for path, _ in _parsers():
        assert main([*path, "--help"]) == 0, path
        assert "example" in capsys.readouterr().out, path


def test_bins_quiet_prints_at_most_the_file_it_wrote(tmp_path, capsys):
    assert main(["corpus", "synthetic", "--out", str(tmp_path), "--num-cuts", "300"]) == 0
    capsys.readouterr()
    out = tmp_path / "profile.yaml"
    assert main(["bins", str(tmp_path / "cuts.jsonl.gz"), "--buckets", "4", "--out", str(out), "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 1, lines
    assert out.exists() and all(str(out) in line for line in lines)
