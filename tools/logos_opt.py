"""`logos-opt`: logos-ir's modular optimizer driver, as `mlir-opt` and `xdsl-opt` are.

It is xDSL's `xDSLOptMain` with the project's dialects, passes, named pipelines and targets registered (see
`logos_ir.registry`), a `.logos` frontend (LOGOS text, `-f logos` for standard input) and a `logos` target that
prints LOGOS text. What `xdsl-opt` users know keeps working: `-p` pipelines with options, `-t`, `-o`,
`--split-input-file`, `--print-op-generic`, `--print-between-passes` (alias `--print-ir-after-all`). What `mlir-opt`
users know works too: `--pass-pipeline='builtin.module(...)'` (also in `-p`), `-` for standard input and `-o -`
for standard output, `--mlir-print-op-generic`, `--mlir-print-debuginfo`, `--mlir-print-ir-before-all`,
`--mlir-print-ir-after-all`, `--mlir-print-ir-after-change` and `--mlir-timing` (on standard error), and
`--verify-diagnostics` checking the input's `// expected-error {{...}}` comments (`expected_diagnostics`). Every op
read from MLIR or LOGOS is located at its `file:line:col`, and a verifier error names that place. A named pipeline
in `-p` (`logos-middle-end{cut="decode_layer layer=3 ctx=128" tp=2}`) expands into its passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, NameLoc, StringAttr, UnknownLoc
from xdsl.ir import Attribute, AttributeInvT, Operation, SSAValue
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.passes import ModulePass
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span
from xdsl.xdsl_opt_main import xDSLOptMain

from logos_ir import registry
from logos_ir.cli import USAGE_ERROR, USER_ERROR, _ListModels, diagnostic_text, run_tool, version_text, write_output
from logos_ir.errors import LogosError
from logos_ir.tools import expected_diagnostics, pass_pipeline


class _Held(io.StringIO):
    """Output held in memory until the run succeeds (xDSL closes its output stream whatever happens)."""

    def close(self) -> None:
        """Kept open: `run` reads what was written once the whole run has succeeded."""


class _InputError(DiagnosticException):
    """The input cannot be read (LOGOS text that does not parse, bytes that are not text): a parse diagnostic."""


class _LocatingParser(Parser):
    """xDSL's MLIR parser, each op it reads without a `loc(...)` located at the `file:line:col` it starts at, and a
    value used but never defined reported at its first use (xDSL reports it at the end of the input)."""

    line_offset = 0
    _first_uses: dict[str, Span[str] | Span[bytes]] | None = None

    def resolve_operand(self, operand: UnresolvedOperand, type: AttributeInvT) -> SSAValue[AttributeInvT]:
        if self._first_uses is None:
            self._first_uses = {}
        if operand.operand_name not in self.ssa_values:
            self._first_uses.setdefault(operand.operand_name, operand.span)
        return super().resolve_operand(operand, type)

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        try:
            return super().parse_module(allow_implicit_module)
        except ParseError as error:
            undefined = next(iter(self.forward_ssa_references), None)
            first = (self._first_uses or {}).get(undefined or "")
            if not error.msg.startswith("values used but not defined") or first is None:
                raise
            raise ParseError(first, f"use of undefined value %{undefined}: it is defined nowhere") from None

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):
            where = start.get_location()
            op.location = FileLineColLoc(
                StringAttr(where.file), IntAttr(where.line + self.line_offset), IntAttr(where.col)
            )
        return op


class LogosOptMain(xDSLOptMain):
    version_format = "logos-opt (logos-ir) built on xdsl version {xdsl_version}"
    _held: _Held | None = None
    exit_code = 0
    _timings: list[tuple[str, float]]

    def prepare_output(self) -> IO[str]:
        if self.args.output_file is None:
            return sys.stdout
        self._held = _Held()
        return self._held

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        if self.args.input_file == "-":  # mlir-opt's name for standard input
            return sys.stdin.buffer, "mlir"
        return super().get_input_stream()

    def get_input_name(self) -> str:
        return "stdin" if self.args.input_file in (None, "-") else self.args.input_file

    def run(self) -> None:
        """Run every chunk, then write `-o` (`cli.write_output`): a failing run leaves no output, or the old one,
        never half. With `--verify-diagnostics` and `expected-*` comments in the input, the diagnostics are checked
        against them (`exit_code` 1 on a mismatch); with no such comment, each diagnostic is printed, as xdsl-opt
        does."""
        chunks, extension = self.prepare_input()
        texts = [(_read_all(chunk), offset) for chunk, offset in chunks]
        checking = self.args.verify_diagnostics and any(
            expected_diagnostics.expectations(data.decode("utf-8", "replace")) for data, _ in texts
        )
        output = self.prepare_output()
        problems: list[str] = []
        for index, (data, offset) in enumerate(texts):
            if index > 0:
                output.write("// -----\n")
            diagnostics = self._run_chunk(data, extension, offset, output, checking)
            if checking:
                expected = expected_diagnostics.expectations(data.decode("utf-8", "replace"), offset)
                problems += expected_diagnostics.mismatches(self.get_input_name(), expected, diagnostics)
        self._report_timing()
        for problem in problems:
            print(problem, file=sys.stderr)
        self.exit_code = USER_ERROR if problems else 0
        if self._held is not None:
            write_output(self.args.output_file, self._held.getvalue())

    def _run_chunk(
        self, data: bytes, extension: str, offset: int, output: IO[str], checking: bool
    ) -> list[expected_diagnostics.Produced]:
        """One chunk through the pipeline into `output`; the diagnostics it gave where they are being checked."""
        try:
            started = time.perf_counter()
            module = self.parse_chunk(io.BytesIO(data), extension, offset)
            self._timings.append(("Parser", time.perf_counter() - started))
            if module is not None:
                self.apply_passes(module)
                started = time.perf_counter()
                output.write(self.output_resulting_program(module))
                self._timings.append(("Output", time.perf_counter() - started))
            output.flush()
        except (ParseError, _InputError) as error:
            if isinstance(error, ParseError):
                error.span = dataclasses.replace(error.span, line_offset=offset)
            if checking:
                return [expected_diagnostics.produced(diagnostic_text("logos-opt", str(error)))]
            if not (self.args.parsing_diagnostics or self.args.verify_diagnostics):
                raise
            print(error)
        except DiagnosticException as error:
            if checking:
                return [expected_diagnostics.produced(diagnostic_text("logos-opt", str(error)))]
            if not self.args.verify_diagnostics:
                raise
            print(error)
            for note in getattr(error, "__notes__", ()):
                print(note)
        return []

    def prepare_input(self):  # type: ignore[no-untyped-def]
        """xDSL's, with an input of no known kind reported as a usage mistake rather than a failure of the tool."""
        try:
            return super().prepare_input()
        except ValueError as error:
            if "Unrecognized file extension" not in str(error):
                raise
            known = ", ".join(f".{name}" for name in sorted(self.available_frontends))
            print(f"logos-opt: error: {error}: give a file named {known}, or name its kind with -f", file=sys.stderr)
            raise SystemExit(USAGE_ERROR) from None

    def register_all_dialects(self) -> None:
        from logos_ir import xdsl_guards

        xdsl_guards.apply()  # before any input is read
        super().register_all_dialects()
        for name, factory in registry.dialects().items():
            self.ctx.register_dialect(name, factory)
        from logos_ir.dialects.gpu_ext import extend_gpu_and_llvm
        from logos_ir.dialects.shard_ext import extend_shard

        extend_shard()  # upstream's shard.all_gather (a split head's logits), which xDSL 0.74's shard dialect lacks
        extend_gpu_and_llvm()  # upstream's gpu.shuffle and llvm.fence (the CUDA lane's kernels), which xDSL 0.74 lacks

    def register_all_frontends(self) -> None:
        super().register_all_frontends()
        self.available_frontends["logos"] = self._parse_logos  # type: ignore[assignment]  # may skip a chunk

    def _parse_logos(self, stream: IO[bytes], line_offset: int = 0) -> ModuleOp | None:
        from logos_ir.parser import parse_program

        data, skipped = skip_preamble(stream.read())
        if not data and self.args.split_input_file and skipped:
            return None  # a chunk of only `//` lines: a lit test's RUN and CHECK lines
        return ModuleOp([parse_program(data, self.get_input_name(), line_offset=line_offset + skipped)])

    def parse_chunk(  # type: ignore[override]
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        """Read one input (or chunk) and verify it, so every fault of the input is reported as the input's."""
        try:
            module = self._read(chunk, file_extension, start_offset)
            if module is not None and not self.args.disable_verify:
                verify_located(module)
            return module
        except LogosError as error:
            raise _InputError(str(error)) from None
        except (DiagnosticException, ParseError):
            raise
        except UnicodeDecodeError as error:
            raise _InputError(
                f"logos-opt: error: {self.get_input_name()}: the input is not UTF-8 text "
                f"(byte 0x{error.object[error.start]:02x} at offset {error.start})"
            ) from None
        except Exception as error:  # xDSL's reader fails on some malformed MLIR with other exceptions
            raise _InputError(
                f"logos-opt: error: {self.get_input_name()}: cannot read this input as MLIR: "
                f"{type(error).__name__}: {error}"
            ) from None

    def _read(self, chunk: IO[bytes], file_extension: str, start_offset: int) -> ModuleOp | None:
        if file_extension == "mlir" and self.args.input_file in (None, "-") and self.args.frontend is None:
            data = chunk.read()  # standard input with no -f: LOGOS text is recognised by its header
            chunk = io.BytesIO(data)
            if skip_preamble(data)[0].startswith(b"## Program:"):
                file_extension = "logos"
        if file_extension == "logos":
            return self._parse_logos(chunk, start_offset)
        if file_extension == "mlir":
            parser = _LocatingParser(self.ctx, chunk.read(), self.get_input_name())
            parser.line_offset = start_offset
            return parser.parse_module(not self.args.no_implicit_module)
        return super().parse_chunk(chunk, file_extension, start_offset)

    def output_resulting_program(self, prog: ModuleOp) -> str:
        if self.args.print_debuginfo and self.args.target.split("{")[0] == "mlir":
            names_as_locations(prog)
        try:
            return super().output_resulting_program(prog)
        except (LogosError, DiagnosticException):
            lowering = registry.emitter_pipelines().get(self.args.target.split("{")[0])
            if lowering and any(op.name == "logos.program" for op in prog.walk()):
                raise DiagnosticException(
                    f"-t {self.args.target} prints a lowered module, and this one is still LOGOS IR: run "
                    f"-p {lowering} first (logos-opt FILE -p {lowering} -t {self.args.target})"
                ) from None
            raise
        except Exception as error:  # xDSL's printer fails on some attributes that its parser accepted
            raise DiagnosticException(
                f"logos-opt: error: {self.get_input_name()}: cannot print the result: {type(error).__name__}: {error}"
            ) from None

    def apply_passes(self, prog: ModuleOp) -> None:
        try:
            super().apply_passes(prog)
            if self.args.verify_identity:
                from logos_ir.identity import check, programs

                for program in programs(prog):
                    check(program)
        except LogosError as error:
            raise DiagnosticException(str(error)) from None

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in registry.passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        super().register_all_targets()
        for name, factory in registry.emitters().items():
            self.available_targets[name] = factory

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        for action in arg_parser._actions:  # the version the other tools print, and xDSL's beside it
            if "--version" in action.option_strings:
                action.version_format = version_text("logos-opt")  # type: ignore[attr-defined]
        arg_parser.add_argument(
            "--print-ir-after-all",
            action="store_true",
            help="alias of --print-between-passes: the IR after every pass, on standard error",
        )
        _mlir_opt_arguments(arg_parser)
        arg_parser.add_argument(
            "--verify-identity",
            action="store_true",
            help="after the passes, check that each program's recorded identity is the SHA-256 of its own LOGOS print",
        )
        arg_parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
        arg_parser.add_argument("--list-models", action=_ListModels, help="list the models the tools' --model takes")
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.prog = "logos-opt"  # also when run as `python -m logos_ir.tools.logos_opt`
        arg_parser.epilog = self._listing()

    def _listing(self) -> str:
        ours = registry.passes()
        lines = ["logos-ir dialects: " + ", ".join(registry.dialects())]
        lines.append("logos-ir passes:")
        lines += [f"  {name}" for name in ours]
        lines.append("logos-ir pipelines:")
        for pipeline in registry.pipelines().values():
            options = " ".join(f"{o}=..." for o in pipeline.options)
            lines.append(f"  {pipeline.name}{{{options}}}: {pipeline.description}")
        lines.append("targets: " + ", ".join(sorted(self.available_targets)))
        others = sorted(set(self.available_passes) - set(ours))
        lines.append(f"xDSL passes ({len(others)}): " + ", ".join(others))
        return "\n".join(lines)

    def setup_pipeline(self) -> None:
        """The passes of `-p` or `--pass-pipeline`, in either spelling, named pipelines expanded; with the IR
        printed (on standard error) and timed between them as asked, and verified after each."""
        from xdsl.passes import PassPipeline
        from xdsl.utils.exceptions import ArgSpecParseError

        self._timings = []
        option, text = self._pipeline_text()
        try:
            flat = expand_pipelines(pass_pipeline.flat_pipeline(text, option), option)
            pass_pipeline.check_options(flat, self.available_passes, option)
            self.pipeline = PassPipeline.parse_spec(self.available_passes, flat, _Watch(self).callback)
        except ArgSpecParseError as error:  # a BaseException in xDSL; what reaches here is a value it refused
            raise pass_pipeline.PipelineError(f"{option}: {error}") from None
        except pass_pipeline.PipelineError:
            raise
        except ValueError as error:  # xDSL's refusal of a pass or of an option's value: its own words
            raise pass_pipeline.PipelineError(str(error)) from None

    def _pipeline_text(self) -> tuple[str, str]:
        if self.args.pass_pipeline is not None and self.args.passes:
            raise pass_pipeline.PipelineError("give the passes once: -p or --pass-pipeline, not both")
        if self.args.pass_pipeline is not None:
            return "--pass-pipeline", self.args.pass_pipeline
        return "-p", self.args.passes

    def _report_timing(self) -> None:
        """`--mlir-timing`: mlir-opt's execution time report, on standard error."""
        if not self.args.mlir_timing:
            return
        total = sum(seconds for _, seconds in self._timings) or 1e-9
        rule = "===" + "-" * 73 + "==="
        lines = [rule, " " * 25 + "... Execution time report ...", rule]
        lines += [f"  Total Execution Time: {total:.4f} seconds", "", "  ----Wall Time----  ----Name----"]
        lines += [f"  {seconds:8.4f} ({100 * seconds / total:5.1f}%)  {name}" for name, seconds in self._timings]
        lines.append(f"  {total:8.4f} (100.0%)  Total")
        print("\n".join(lines), file=sys.stderr)


class _Watch:
    """What runs between passes: the verifier, the IR printed before or after a pass as asked (mlir-opt's
    `// -----// IR Dump After ...` headers, or xdsl-opt's `IR after ...:`), the timings."""

    def __init__(self, tool: LogosOptMain):
        self.tool, self.args = tool, tool.args
        self.started = time.perf_counter()
        self.before = ""

    def callback(self, previous: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        if previous is not None:
            self._after(previous, module)
        if not self.args.disable_verify:
            module.verify()
        if following is not None:
            self._before(following, module)
        self.started = time.perf_counter()

    def _after(self, previous: ModulePass, module: ModuleOp) -> None:
        seconds = time.perf_counter() - self.started
        self.tool._timings.append((f"{type(previous).__name__} ({previous.name})", seconds))
        if self.args.time_passes:
            print(f"Pass {previous.name} took {seconds} seconds", file=sys.stderr)
        if self.args.print_between_passes or self.args.print_ir_after_all:
            print(f"IR after {previous.name}:\n{self._print(module)}\n\n\n", file=sys.stderr)
        changed = self.args.mlir_print_ir_after_change and self._print(module) != self.before
        if self.args.mlir_print_ir_after_all or changed:
            self._dump("After", previous, module)

    def _before(self, following: ModulePass, module: ModuleOp) -> None:
        if self.args.mlir_print_ir_before_all:
            self._dump("Before", following, module)
        if self.args.mlir_print_ir_after_change:
            self.before = self._print(module)

    def _dump(self, when: str, which: ModulePass, module: ModuleOp) -> None:
        header = f"// -----// IR Dump {when} {type(which).__name__} ({which.name}) //----- //"
        print(f"{header}\n{self._print(module)}\n", file=sys.stderr)

    def _print(self, module: ModuleOp) -> str:
        out = io.StringIO()
        Printer(
            out, print_generic_format=self.args.print_op_generic, print_debuginfo=self.args.print_debuginfo
        ).print_op(module)
        return out.getvalue()


def _mlir_opt_arguments(parser: argparse.ArgumentParser) -> None:
    """mlir-opt's spellings of what logos-opt does."""
    parser.add_argument(
        "--pass-pipeline",
        default=None,
        metavar="PIPELINE",
        help="the passes in MLIR's textual form, builtin.module(pass{option=value},...) (or -p's flat list)",
    )
    parser.add_argument("--mlir-print-op-generic", dest="print_op_generic", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mlir-print-debuginfo", dest="print_debuginfo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mlir-print-ir-before-all", action="store_true", help="the IR before every pass (stderr)")
    parser.add_argument("--mlir-print-ir-after-all", action="store_true", help="the IR after every pass (stderr)")
    parser.add_argument(
        "--mlir-print-ir-after-change", action="store_true", help="the IR after every pass that changed it (stderr)"
    )
    parser.add_argument("--mlir-timing", action="store_true", help="the time of parsing, each pass and printing")


def _read_all(chunk: IO[bytes]) -> bytes:
    try:
        return chunk.read()
    finally:
        chunk.close()


def names_as_locations(module: ModuleOp) -> None:
    """Each named value's name carried in its location, as MLIR's `NameLoc` (`loc("normed"("f.logos":26:5))`): the
    debug info a printed module takes upstream, where SSA names are not kept but `--mlir-use-nameloc-as-prefix`
    prints each value under its location's name. The values are an op's one result and a block's arguments; a
    location that already names its value is left as it is."""
    for op in module.walk():
        if len(op.results) == 1:
            op.location = _named(op.results[0], op.location)
        for region in op.regions:
            for block in region.blocks:
                for arg in block.args:
                    arg.location = _named(arg, arg.location)


def _named(value: SSAValue, location: Attribute) -> Attribute:
    if value.name_hint is None or isinstance(location, NameLoc):
        return location
    return NameLoc(StringAttr(value.name_hint), location)


def _file_location(location: Attribute) -> FileLineColLoc | None:
    """The `file:line:col` a location names, through the names (`NameLoc`) that wrap it."""
    while isinstance(location, NameLoc):
        location = location.location
    return location if isinstance(location, FileLineColLoc) else None


def verify_located(module: ModuleOp) -> None:
    """Verify `module`; a failing op with a location is named at its `file:line:col`, as mlir-opt does."""
    try:
        module.verify()
    except VerifyException as error:
        op = next((op for op in _post_order(module) if _fails(op)), None)
        loc = None if op is None else _file_location(op.location)
        if loc is None:
            raise
        located = VerifyException(f"{loc.filename.data}:{loc.line.data}:{loc.column.data}: error: {error}")
        for note in getattr(error, "__notes__", ()):
            located.add_note(note)
        raise located from None


def _post_order(op: Operation) -> Iterator[Operation]:
    """Ops in the order xDSL's verifier checks them: an op's nested ops before the op itself."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                yield from _post_order(inner)
    yield op


def _fails(op: Operation) -> bool:
    try:
        op.verify(verify_nested_ops=False)
    except VerifyException:
        return True
    return False


def skip_preamble(data: bytes) -> tuple[bytes, int]:
    """LOGOS has no comments; a lit test's `//` lines (and the blank lines `--split-input-file` leaves) before the
    program are skipped here, in the driver, so the program's text, and so its digest, stays exactly the program."""
    skipped = 0
    while data.startswith((b"\n", b"//")):
        end = data.find(b"\n")
        data = b"" if end < 0 else data[end + 1 :]
        skipped += 1
    return data, skipped


def expand_pipelines(spec: str, option: str = "-p") -> str:
    """`-p` with each named pipeline replaced by the passes it runs."""
    if not spec:
        return spec
    named = registry.pipelines()
    out: list[str] = []
    for item in pass_pipeline.parsed(spec, option):
        pipeline = named.get(item.name)
        if pipeline is None:
            out.append(str(item))
            continue
        unknown = set(item.parameters) - set(pipeline.options)
        if unknown:
            raise pass_pipeline.PipelineError(
                f"{option}: pipeline {item.name} has no option '{sorted(unknown)[0]}' (its options: "
                f"{', '.join(pipeline.options)})"
            )
        options = {key: _option_text(values) for key, values in item.parameters.items()}  # plain values
        out += pipeline.stages(options)
    return ",".join(out)


def _option_text(values: Sequence[object]) -> str:
    """An option's value as plain text (a pipeline quotes it where its passes need quotes)."""
    value = values[0] if len(values) == 1 else " ".join(str(v) for v in values)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        try:
            tool = LogosOptMain(description="logos-ir modular optimizer driver", args=argv)
        except ValueError as error:  # an unknown pass or a malformed pipeline
            print(f"logos-opt: error: {error}", file=sys.stderr)
            return USAGE_ERROR
        tool.run()
        return tool.exit_code

    return run_tool("logos-opt", body, argv)


if __name__ == "__main__":
    sys.exit(main())
