"""A sweep of mlir-opt's habits over `logos-opt`: each gives what an mlir-opt user expects, none a traceback.

Pipelines in MLIR's textual form, one clean usage error for each malformed pipeline (naming the character or the
option), `-` and `-o -`, the `--mlir-print-*` options and `--mlir-timing` on standard error, `--print-ir-after-all`
after a one-pass pipeline, `--verify-diagnostics` with `expected-error` comments and their `@` forms, and ops
located at their `file:line:col`. The tool runs in this process."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from logos_ir.author import write
from logos_ir.cli import USAGE_ERROR, USER_ERROR
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.tools import logos_opt

BAD_INPUT = 'logos.input "tokenz" values [1] : tensor<1xi64>'
GOOD_INPUT = 'logos.input "token" values [1] : tensor<1xi64>'


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("habits") / "decode.logos"
    path.write_text(write(ModelSpec.preset("tiny"), Cut.parse("decode ctx=8")).text)
    return path


def opt(capfd: pytest.CaptureFixture[str], *argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        code = logos_opt.main(list(argv))
    finally:
        sys.stdin = sys.__stdin__
    out, err = capfd.readouterr()
    assert "Traceback" not in err
    return code, out, err


MALFORMED = {
    "tp-split{tp=2": ["column 9", "'{' is never closed"],
    "builtin.module(tp-split{tp=2}": ["column 15", "'(' is never closed"],
    ",": ["column 1", "a pass name is missing"],
    "tp-split,,verify-identity": ["column 10", "a pass name is missing"],
    "tp-split}": ["column 9", "'}' closes nothing"],
    'cut-extract{cut="decode_head}': ["column 17", "no closing '\"'"],
    "tp-split{=2}": ["column 10", "expected argument name"],
    "tp-split{tp=2}x": ["column 15", "expected a comma"],
    "tp-split{tpp=2}": ["pass tp-split has no option 'tpp'", "its options: tp"],
    "tp-split{tp=2,3}": ["pass tp-split: option 'tp' takes int, not 2,3"],
    "tp-split{tp}": ["pass tp-split: option 'tp' takes int, not nothing"],
    "logos-middle-end{cutt=decode_head}": ["pipeline logos-middle-end has no option 'cutt'"],
    "func.func(tp-split{tp=2})": ["module passes only", "func.func"],
    "no-such-pass": ["no-such-pass"],
}


@pytest.mark.parametrize("option", ["-p", "--pass-pipeline"])
@pytest.mark.parametrize("pipeline", sorted(MALFORMED))
def test_a_malformed_pipeline_is_one_usage_error(
    pipeline: str, option: str, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = opt(capfd, str(program), f"{option}={pipeline}")
    assert code == USAGE_ERROR
    assert err.startswith("logos-opt: error: ") and err.count("\n") == 1, err
    for words in MALFORMED[pipeline]:
        assert words in err
    assert out == ""


@pytest.mark.parametrize(
    "spelling",
    [
        ["-p", "tp-split{tp=2}"],
        ["-p", "builtin.module(tp-split{tp=2})"],
        ["--pass-pipeline=builtin.module(tp-split{tp=2})"],
        ["--pass-pipeline", "builtin.module(any(tp-split{tp=2}))"],
    ],
)
def test_pipeline_spellings_agree(spelling: list[str], program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, flat, _ = opt(capfd, str(program), "-p", "tp-split{tp=2}", "-t", "logos")
    assert code == 0 and "2 chips" in flat
    assert opt(capfd, str(program), *spelling, "-t", "logos")[:2] == (0, flat)


def test_both_pipeline_options_are_refused(program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = opt(capfd, str(program), "-p", "tp-split{tp=2}", "--pass-pipeline=builtin.module()")
    assert code == USAGE_ERROR and "-p or --pass-pipeline" in err


def test_dash_reads_standard_input_and_writes_standard_output(
    program: Path, capfd: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = opt(capfd, "-", "-t", "logos", "-o", "-", stdin=program.read_bytes())
    assert (code, out) == (0, program.read_text())
    assert list(tmp_path.iterdir()) == []


def test_mlir_print_op_generic(program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = opt(capfd, str(program), "--mlir-print-op-generic")
    assert code == 0 and out.startswith('"builtin.module"() ({')


def test_mlir_print_debuginfo_locates_logos_ops(program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = opt(capfd, str(program), "--mlir-print-debuginfo")
    assert code == 0
    lines = program.read_text().split("\n")
    first = next(i for i, line in enumerate(lines, start=1) if line.startswith("    Let token be"))
    # a value's name travels in its location (MLIR's NameLoc), as upstream's --mlir-use-nameloc-as-prefix reads it
    assert f'logos.input "token" values [1] : tensor<1xi64> loc("token"("{program}":{first}:5))' in out
    assert f'loc("{program}":1:1)' in out  # the program op, at its header
    header = next(i for i, line in enumerate(lines, start=1) if line.startswith("## Embedding of token"))
    assert f'@embedding(%token: tensor<1xi64> loc("token"("{program}":{header}:1)))' in out  # a section's parameter


def test_mlir_print_debuginfo_locates_mlir_ops(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "in.mlir"
    source.write_text(f"\n  %t = {GOOD_INPUT}\n")
    code, out, _ = opt(capfd, str(source), "--mlir-print-debuginfo")
    assert code == 0 and f'loc("t"("{source}":2:3))' in out


@pytest.mark.parametrize(
    ("flag", "header"),
    [
        ("--mlir-print-ir-after-all", "// -----// IR Dump After TpSplit (tp-split) //----- //"),
        ("--mlir-print-ir-before-all", "// -----// IR Dump Before TpSplit (tp-split) //----- //"),
        ("--mlir-print-ir-after-change", "// -----// IR Dump After TpSplit (tp-split) //----- //"),
        ("--print-ir-after-all", "IR after tp-split:"),
        ("--print-between-passes", "IR after tp-split:"),
    ],
)
def test_ir_printing_on_standard_error(
    flag: str, header: str, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each form, on a one-pass pipeline: the dump on standard error, the result alone on standard output."""
    plain = opt(capfd, str(program), "-p", "tp-split{tp=2}")[1]
    code, out, err = opt(capfd, str(program), "-p", "tp-split{tp=2}", flag)
    assert (code, out) == (0, plain)
    assert err.startswith(header + "\n")
    assert ("chips 1" if "Before" in header else "chips 2") in err.split("\n", 2)[2]


def test_after_change_skips_a_pass_that_changes_nothing(program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = opt(capfd, str(program), "-p", "verify-identity,tp-split{tp=2}", "--mlir-print-ir-after-change")
    assert code == 0
    assert "IR Dump After TpSplit" in err and "IR Dump After VerifyIdentity" not in err


@pytest.mark.parametrize("flag", ["--mlir-timing", "--time-passes"])
def test_timing_on_standard_error(flag: str, program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plain = opt(capfd, str(program), "-p", "tp-split{tp=2}")[1]
    code, out, err = opt(capfd, str(program), "-p", "tp-split{tp=2}", flag)
    assert (code, out) == (0, plain)
    if flag == "--mlir-timing":
        assert "Execution time report" in err and re.search(r"\d+\.\d{4} \(100\.0%\)  Total", err)
        assert "TpSplit (tp-split)" in err and "Parser" in err
    else:
        assert re.search(r"Pass tp-split took [0-9.e-]+ seconds", err)


def test_version_names_logos_ir(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        logos_opt.main(["--version"])
    assert re.match(r"logos-opt \(logos-ir\) \S+, built on xdsl \S+", capfd.readouterr().out)


def test_a_verifier_error_is_located(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "bad.mlir"
    source.write_text(f"// a comment\n%t = {BAD_INPUT}\n")
    code, _, err = opt(capfd, str(source))
    assert code == USER_ERROR
    assert err.startswith(f"{source}:2:1: error: 'logos.input' op has unknown input kind 'tokenz'")


def test_parsing_diagnostics_catches_logos_parse_errors(program: Path, capfd: pytest.CaptureFixture[str]) -> None:
    bad = program.read_text().replace("has 256 tokens", "has many tokens", 1)
    code, out, _ = opt(capfd, "-f", "logos", "--parsing-diagnostics", stdin=bad.encode())
    assert code == 0 and "stdin:2:" in out and "expected a whole number" in out


# --verify-diagnostics with expected-* comments: (input, exit code, words standard error holds)
EXPECTATIONS = {
    "right, on its line": (f"%t = {BAD_INPUT} // expected-error {{{{unknown input kind 'tokenz'}}}}\n", 0, []),
    "right, @+1": (f"// expected-error@+1 {{{{unknown input kind}}}}\n%t = {BAD_INPUT}\n", 0, []),
    "right, @above": (f"%t = {BAD_INPUT}\n// expected-error@above {{{{unknown input kind}}}}\n", 0, []),
    "right, @-2": (f"%t = {BAD_INPUT}\n\n// expected-error@-2 {{{{unknown input kind}}}}\n", 0, []),
    "wrong text": (
        f"%t = {BAD_INPUT} // expected-error {{{{unknown output kind}}}}\n",
        USER_ERROR,
        [":1:", 'expected error "unknown output kind" was not produced', "unexpected error: 'logos.input' op"],
    ),
    "wrong line": (
        f"// expected-error@+2 {{{{unknown input kind}}}}\n%t = {BAD_INPUT}\n",
        USER_ERROR,
        ["was not produced (on line 3)", ":2:1: error: unexpected error:"],
    ),
    "expected, none given": (
        f"%t = {GOOD_INPUT} // expected-error {{{{unknown input kind}}}}\n",
        USER_ERROR,
        ['expected error "unknown input kind" was not produced'],
    ),
    "a warning never given": (
        f"%t = {BAD_INPUT} // expected-error {{{{unknown input kind}}}} expected-warning {{{{careful}}}}\n",
        USER_ERROR,
        ['expected warning "careful" was not produced'],
    ),
    "split, each chunk its own": (
        f"%t = {BAD_INPUT} // expected-error {{{{unknown input kind}}}}\n// -----\n%t = {GOOD_INPUT}\n"
        f"// -----\n\n%t = {BAD_INPUT}\n// expected-error@-1 {{{{unknown input kind}}}}\n",
        0,
        [],
    ),
    "split, the wrong chunk": (
        f"%t = {GOOD_INPUT}\n// -----\n%t = {BAD_INPUT}\n// expected-error@-2 {{{{unknown input kind}}}}\n",
        USER_ERROR,
        ["was not produced (on line 2)", ":3:1: error: unexpected error:"],
    ),
}


@pytest.mark.parametrize("case", sorted(EXPECTATIONS))
def test_verify_diagnostics_checks_expectations(case: str, capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text, expected_code, words = EXPECTATIONS[case]
    source = tmp_path / "case.mlir"
    source.write_text(text)
    code, _, err = opt(capfd, str(source), "--split-input-file", "--verify-diagnostics")
    assert code == expected_code, err
    for word in words:
        assert word in err
    if expected_code == 0:
        assert err == ""


def test_verify_diagnostics_without_expectations_prints_them(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An input with no expected-* comment: each diagnostic is printed and the run succeeds (xdsl-opt's way)."""
    source = tmp_path / "plain.mlir"
    source.write_text(f"%t = {BAD_INPUT}\n")
    code, out, _ = opt(capfd, str(source), "--verify-diagnostics")
    assert code == 0 and "unknown input kind 'tokenz'" in out


def test_an_undefined_value_is_reported_at_its_use(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "undefined.mlir"
    source.write_text(
        "func.func @f() -> tensor<1xi64> {\n"
        "  %a = logos.argmax %nope : (tensor<1x4xf32>) -> tensor<1xi64>\n"
        "  func.return %a : tensor<1xi64>\n"
        "}\n"
    )
    code, _, err = opt(capfd, str(source))
    assert code == USER_ERROR
    assert err.startswith(f"{source}:2:21: error: use of undefined value %nope")
