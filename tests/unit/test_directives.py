"""#GSUB / #SBATCH directive reading, the way sbatch reads them."""

from __future__ import annotations

import pytest

from gpusched.cli.directives import Directive, read_directive_lines, read_directives
from gpusched.errors import UsageError


def test_both_prefixes_are_read_in_order() -> None:
    script = "#!/bin/bash\n#SBATCH --gpus=2\n#GSUB -t 10\necho hi\n"
    assert read_directives(script) == ["--gpus=2", "-t", "10"]


def test_blank_lines_and_comments_do_not_end_the_block() -> None:
    script = "#!/bin/sh\n\n# a comment\n   \n  # indented comment\n#SBATCH -J x\nrun\n"
    assert read_directives(script) == ["-J", "x"]


def test_reading_stops_at_the_first_command() -> None:
    script = "#!/bin/sh\n#GSUB --gpus 1\nmodule load cuda\n#GSUB --gpus 8\n"
    assert read_directives(script) == ["--gpus", "1"]


def test_several_options_on_one_line_and_quotes() -> None:
    script = '#!/bin/sh\n#SBATCH --job-name "my long job" -o \'out %j.txt\' --gpus=2\n'
    assert read_directives(script) == ["--job-name", "my long job", "-o", "out %j.txt", "--gpus=2"]


def test_an_inline_comment_ends_the_directive() -> None:
    script = "#!/bin/sh\n#SBATCH --gpus=2   # two is plenty\n#GSUB -t 5 #no space needed after #\n"
    assert read_directives(script) == ["--gpus=2", "-t", "5"]


def test_a_hash_inside_a_word_or_quotes_is_kept() -> None:
    script = '#!/bin/sh\n#SBATCH -o run#1.out -J "a # b" --error=e\\#x\n'
    assert read_directives(script) == ["-o", "run#1.out", "-J", "a # b", "--error=e#x"]


def test_only_exact_prefixes_at_line_start_are_directives() -> None:
    script = (
        "#!/bin/sh\n"
        "#SBATCHX --gpus=1\n"      # another word: a comment
        " #SBATCH --gpus=2\n"      # indented: a comment, as in sbatch
        "# SBATCH --gpus=3\n"      # commented out
        "#sbatch --gpus=4\n"       # case matters
        "#GSUB\n"                  # empty directive: nothing
        "#GSUB\t--gpus=5\n"        # a tab separates too
    )
    assert read_directives(script) == ["--gpus=5"]


def test_line_numbers_and_prefixes_are_reported() -> None:
    script = "#!/bin/sh\n\n#GSUB -G 1\n#SBATCH -t 5\n"
    assert read_directive_lines(script) == [
        Directive(3, "#GSUB", ("-G", "1")),
        Directive(4, "#SBATCH", ("-t", "5")),
    ]


def test_without_a_shebang_reading_starts_at_the_first_line() -> None:
    assert read_directives("#GSUB -G 1\ntrue\n") == ["-G", "1"]


def test_no_directives_and_empty_text() -> None:
    assert read_directives("#!/bin/sh\necho hi\n") == []
    assert read_directives("") == []


def test_crlf_lines_are_split_too() -> None:
    assert read_directives("#!/bin/sh\r\n#GSUB -G 1\r\ntrue\r\n") == ["-G", "1"]


def test_an_unclosed_quote_is_a_usage_error_naming_the_line() -> None:
    with pytest.raises(UsageError, match=r"line 3: #SBATCH directive: No closing quotation"):
        read_directives('#!/bin/sh\n#GSUB -G 1\n#SBATCH -J "oops\n')
