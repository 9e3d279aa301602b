"""`logos-opt`: logos-ir's modular optimizer driver, as `mlir-opt` and `xdsl-opt` are.

It is xDSL's `xDSLOptMain` with the project's dialects, passes, named pipelines and targets registered (see
`logos_ir.registry`), a `.logos` frontend (LOGOS text, `-f logos` for standard input) and a `logos` target that
prints LOGOS text. Everything `xdsl-opt` users know keeps working: `-p` pipelines with options, `-t`, `-o`,
`--split-input-file`, `--verify-diagnostics`, `--print-op-generic`, `--print-between-passes` (alias
`--print-ir-after-all`). A named pipeline in `-p` (`logos-middle-end{cut="decode_layer layer=3 ctx=128" tp=2}`)
expands into its passes.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from logos_ir import registry
from logos_ir.cli import USAGE_ERROR, _ListModels, run_tool, write_output
from logos_ir.errors import LogosError


class _Held(io.StringIO):
    """Output held in memory until the run succeeds (xDSL closes its output stream whatever happens)."""

    def close(self) -> None:
        """Kept open: `run` reads what was written once the whole run has succeeded."""


class LogosOptMain(xDSLOptMain):
    version_format = "logos-opt (logos-ir) built on xdsl version {xdsl_version}"
    _held: _Held | None = None

    def prepare_output(self) -> IO[str]:
        if self.args.output_file is None:
            return sys.stdout
        self._held = _Held()
        return self._held

    def run(self) -> None:
        """Run, then write `-o` (`cli.write_output`): a failing run leaves no output, or the old one, never half."""
        super().run()
        if self._held is not None:
            write_output(self.args.output_file, self._held.getvalue())

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
        from logos_ir.dialects.shard_ext import extend_shard

        extend_shard()  # upstream's shard.all_gather (a split head's logits), which xDSL 0.74's shard dialect lacks

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
                module.verify()
            return module
        except LogosError as error:
            raise DiagnosticException(str(error)) from None
        except (DiagnosticException, ParseError):
            raise
        except UnicodeDecodeError as error:
            raise DiagnosticException(
                f"logos-opt: error: {self.get_input_name()}: the input is not UTF-8 text "
                f"(byte 0x{error.object[error.start]:02x} at offset {error.start})"
            ) from None
        except Exception as error:  # xDSL's reader fails on some malformed MLIR with other exceptions
            raise DiagnosticException(
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
        return super().parse_chunk(chunk, file_extension, start_offset)

    def output_resulting_program(self, prog: ModuleOp) -> str:
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
        arg_parser.add_argument("--print-ir-after-all", action="store_true", help="alias of --print-between-passes")
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
        if self.args.print_ir_after_all:
            self.args.print_between_passes = True
        self.args.passes = expand_pipelines(self.args.passes)
        super().setup_pipeline()


def skip_preamble(data: bytes) -> tuple[bytes, int]:
    """LOGOS has no comments; a lit test's `//` lines (and the blank lines `--split-input-file` leaves) before the
    program are skipped here, in the driver, so the program's text, and so its digest, stays exactly the program."""
    skipped = 0
    while data.startswith((b"\n", b"//")):
        end = data.find(b"\n")
        data = b"" if end < 0 else data[end + 1 :]
        skipped += 1
    return data, skipped


def expand_pipelines(spec: str) -> str:
    """`-p` with each named pipeline replaced by the passes it runs."""
    from xdsl.utils.arg_spec import parse_pipeline

    if not spec:
        return spec
    named = registry.pipelines()
    out: list[str] = []
    for item in parse_pipeline(spec):
        pipeline = named.get(item.name)
        if pipeline is None:
            out.append(str(item))
            continue
        unknown = set(item.parameters) - set(pipeline.options)
        if unknown:
            raise ValueError(f"pipeline {item.name} has no option {', '.join(sorted(unknown))}")
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
        return 0

    return run_tool("logos-opt", body, argv)


if __name__ == "__main__":
    sys.exit(main())
